"""Paged attention (naive.py, native.py, triton.py). The decode split count lives here, without Triton, so
the memory ledger (engine/memory.py) sizes the split-K partials with the kernel's own rule."""

MAX_DECODE_SPLITS = 32


def num_decode_splits(max_context: int) -> int:
    """Key splits per (sequence, kv head) for decode: enough programs to fill the GPU at long context."""
    return max(1, min(MAX_DECODE_SPLITS, -(-max_context // 1024)))
