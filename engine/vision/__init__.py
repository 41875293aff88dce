"""Images in the prompt (Qwen3.5 / Qwen3-VL style): preprocessing, the vision tower, M-RoPE positions."""
