"""Qwen2 (Qwen2.5, Qwen2.5-Coder: the FIM models editor plugins run): Llama with biased q / k / v
projections. An HF checkpoint and a GGUF written as llama.cpp's converter writes one generate transformers'
greedy tokens; a config with sliding-window attention on is refused."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from conftest import hf_greedy_reference, save_tiny, tiny_hf_model
from test_gguf_qwen35 import close_gguf, gguf_writer

from engine import LLM, NinferError, SamplingParams

PROMPT = [5, 17, 33, 2, 91, 45, 12, 7, 88, 3, 140, 61, 9, 27]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return tiny_hf_model("qwen2", tied=False, seed=3)


def test_hf_and_gguf_qwen2_generate_transformers_greedy_tokens(model, tmp_path):
    assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0  # the biases matter here
    want, _ = hf_greedy_reference(model, PROMPT, GREEDY.max_tokens)
    hf = LLM(save_tiny(model, tmp_path / "hf"))
    assert hf.model_config.qkv_bias and not hf.model_config.attention_bias
    assert hf.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids == want
    cfg, blocks = model.config, model.config.num_hidden_layers
    writer = gguf_writer(tmp_path / "q2.gguf", "qwen2", cfg, blocks)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, blocks)
    for hf_name, tensor in model.state_dict().items():
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight", ".bias")), tensor.float().numpy())
    path = close_gguf(writer, tmp_path / "q2.gguf")
    from_gguf = LLM(path)
    assert from_gguf.model_config.architecture == "Qwen2ForCausalLM" and from_gguf.model_config.qkv_bias
    assert from_gguf.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids == want


def test_sliding_window_attention_is_refused(model, tmp_path):
    path = save_tiny(model, tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
    with pytest.raises(NinferError, match="turns sliding-window attention on"):
        LLM(path)


def test_gguf_tensors_with_no_place_are_named(model, tmp_path, caplog):
    """A GGUF tensor the loader has no name for (a variant's extra tensor) is said in one warning, not
    dropped silently; the rest loads as ever."""
    cfg, blocks = model.config, model.config.num_hidden_layers
    writer = gguf_writer(tmp_path / "q2.gguf", "qwen2", cfg, blocks)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, blocks)
    for hf_name, tensor in model.state_dict().items():
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight", ".bias")), tensor.float().numpy())
    writer.add_tensor("blk.1.attn_sinks.weight", np.ones(cfg.num_attention_heads, dtype=np.float32))
    path = close_gguf(writer, tmp_path / "q2.gguf")
    with caplog.at_level("WARNING", logger="ninfer"):
        llm = LLM(path)
    warned = [r.getMessage() for r in caplog.records if "no place for" in r.getMessage()]
    assert warned == [
        "ignored 1 GGUF tensor(s) this Qwen2ForCausalLM model has no place for: blk.1.attn_sinks.weight"
    ]
    want, _ = hf_greedy_reference(model, PROMPT, GREEDY.max_tokens)
    assert llm.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids == want
