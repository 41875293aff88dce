"""Paged attention (naive.py, native.py, triton.py). The decode split count lives here, without Triton, so
the memory ledger (engine/memory.py) sizes the split-K partials with the kernel's own rule."""

MAX_DECODE_SPLITS = 32
# query rows (verified tokens x the q heads of a kv head) the decode kernel takes for speculative
# verification: at 64 rows the SM 8.6 build uses 255 registers and fp32 KV runs out of shared memory
MAX_VERIFY_ROWS = 32


def same_query_count(cu_seqlens: list[int]) -> int:
    """Every sequence's query tokens when all have the same count, else 0 (query_tokens_per_seq)."""
    counts = {b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])}
    return counts.pop() if len(counts) == 1 else 0


def takes_decode_kernel(num_tokens: int, num_seqs: int, query_tokens_per_seq: int, group: int) -> bool:
    """Whether the Triton path runs a step's attention in its split-K decode kernel: one query token per
    sequence, or the same few per sequence (speculative verification, query_tokens_per_seq a host int);
    else the prefill kernel (the one where --int8-prefill's int8 queries apply)."""
    per_seq = query_tokens_per_seq
    verify = per_seq > 1 and num_tokens == num_seqs * per_seq and per_seq * group <= MAX_VERIFY_ROWS
    return num_tokens == num_seqs or verify


def num_decode_splits(max_context: int) -> int:
    """Key splits per (sequence, kv head) for decode: enough programs to fill the GPU at long context."""
    return max(1, min(MAX_DECODE_SPLITS, -(-max_context // 1024)))
