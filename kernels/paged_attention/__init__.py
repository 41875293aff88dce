"""Paged attention (naive.py, native.py, triton.py). The decode split count lives here, without Triton, so
the memory ledger (engine/memory.py) sizes the split-K partials with the kernel's own rule."""

MAX_DECODE_SPLITS = 32
# 8- / 4-bit caches: twice the splits, each half the keys (see num_decode_splits)
MAX_QUANTIZED_DECODE_SPLITS = 64
QUANTIZED_KV_DTYPES = ("fp8", "int8", "k8v4")
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


def max_decode_splits(kv_dtype: str) -> int:
    """The most splits num_decode_splits gives a cache of this KV dtype."""
    return MAX_QUANTIZED_DECODE_SPLITS if kv_dtype in QUANTIZED_KV_DTYPES else MAX_DECODE_SPLITS


def num_decode_splits(max_context: int, kv_dtype: str = "bf16") -> int:
    """Key splits per (sequence, kv head) for decode: enough programs to fill the GPU at long context, one
    per 1,024 keys up to MAX_DECODE_SPLITS; 8- / 4-bit caches one per 512 up to MAX_QUANTIZED_DECODE_SPLITS,
    as their dequantizing costs each key more instructions and more programs hide them. An H200
    (2026-12-04, CUDA graph replay, 24q / 4kv x 256 at 32K, 64-key tiles) decoded fp8 / int8 / k8v4 caches
    in 41.3 / 43.7 / 43.6 us at 64 splits, 56.4 / 65.0 / 63.4 at 32, 45.5 / 45.8 / 46.7 at 128 (bf16: 38.9
    at 32, 48.0 at 48; docs/benchmarks.md)."""
    keys = 512 if kv_dtype in QUANTIZED_KV_DTYPES else 1024
    return max(1, min(max_decode_splits(kv_dtype), -(-max_context // keys)))
