"""Paged attention in Triton: a flash-attention prefill kernel and a split-K (flash-decoding) decode kernel.

Both read K/V pages through the block table and dequantize every KV dtype in the kernel (see
engine/cache/kv_layout.py): plain dtypes are cast; int8 K/V carry one fp16 scale per token-head; k8v4's V
is int4, two dims per byte (even dim in the low nibble), one fp16 scale per V4_GROUP dims. The products take
the model's half dtype on a GPU (fp32 under the interpreter): int8 codes are cast as they are and their
per-token scales multiply the scores (K) and the probabilities (V) instead of every element of the tile;
k8v4's int4 V becomes floats by bit operations on int32 words (kernels/triton_codes.py), no int-to-float
instruction.

Cache layout: data [num_blocks, block_size, Hk, D'] contiguous; token p of sequence b lives in row
(block_table[b, p // block_size] * block_size + p % block_size) * Hk + h of the flattened cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.int8_act.triton import quantize_rows
from ninfer_kernels.kv_quant.naive import V4_GROUP
from ninfer_kernels.paged_attention import (
    MAX_DECODE_SPLITS,
    max_decode_splits,
    num_decode_splits,
    takes_decode_kernel,
)
from ninfer_kernels.triton_codes import nibble_pairs
from ninfer_kernels.triton_config import compute_capability, dot_dtype, dot_precision, pipeline_stages

_PLAIN, _INT8, _K8V4 = 0, 1, 2
SIXTEEN_BIT_KV = ("bf16", "fp16")  # the caches the SM 9.0 tiles widen for whatever the rows


@triton.jit
def _pages(table, first, end, PAGES: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Block table entries [PAGES] of the pages from key position first (a page boundary) on; 0 from end on.
    table: the sequence's row of the block table."""
    p = tl.arange(0, PAGES)
    return tl.load(table + first // BLOCK_SIZE + p, mask=first + p * BLOCK_SIZE < end, other=0)


@triton.jit
def _slots(page, BLOCK_SIZE: tl.constexpr, WIDE: tl.constexpr):
    """Flat cache slots [PAGES * BLOCK_SIZE] of every position of the pages, in order: int64 when the cache
    holds 2^31 elements or more (WIDE), else int32, whose offsets take fewer instructions a tile."""
    page = page.to(tl.int64) if WIDE else page
    slot = page[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]
    return tl.reshape(slot, (page.shape[0] * BLOCK_SIZE,))


@triton.jit
def _load_codes(ptr, rows, n_mask, d, D, DTYPE: tl.constexpr):
    """K or V tile [BLOCK_N, BLOCK_D] as stored (int8 codes, or the values of a plain dtype) in DTYPE: int8
    codes are exact in every operand dtype; their per-token scale applies to the product instead."""
    mask = n_mask[:, None] & (d[None, :] < D)
    return tl.load(ptr + rows[:, None] * D + d[None, :], mask=mask, other=0.0).to(DTYPE)


@triton.jit
def _load_v4(
    v_ptr, v_scale_ptr, rows, n_mask, D, BLOCK_D: tl.constexpr, V4_GROUP: tl.constexpr, DTYPE: tl.constexpr
):
    """k8v4 V tile [BLOCK_N, BLOCK_D] in DTYPE: the packed row read as int32 words of eight int4 codes (dims
    8t .. 8t + 7); kernels/triton_codes.nibble_pairs turns codes p and p + 4 of every word into floats with
    one integer op for the pair, the offset comes off on the pair, the four pairs are joined back into
    dim order and scaled per V4_GROUP dims."""
    WORDS: tl.constexpr = BLOCK_D // 8
    GROUPS: tl.constexpr = BLOCK_D // V4_GROUP
    t = tl.arange(0, WORDS)
    mask = n_mask[:, None] & (t[None, :] < D // 8)
    word = tl.load(v_ptr + rows[:, None] * (D // 8) + t[None, :], mask=mask, other=0)  # [BLOCK_N, WORDS]
    ZERO: tl.constexpr = 8.0 if DTYPE == tl.float32 else 24.0  # codes are value + 8; + nibble_pair_base
    v0 = nibble_pairs(word, 0, DTYPE) - ZERO  # [BLOCK_N, WORDS, 2]: dims 8t + p, 8t + 4 + p
    v1 = nibble_pairs(word, 1, DTYPE) - ZERO
    v2 = nibble_pairs(word, 2, DTYPE) - ZERO
    v3 = nibble_pairs(word, 3, DTYPE) - ZERO
    v = tl.join(tl.join(v0, v2), tl.join(v1, v3))  # [BLOCK_N, WORDS, 2, 2, 2]: dim 8t + 4h + 2a + b
    g = tl.arange(0, GROUPS)
    scale = tl.load(
        v_scale_ptr + rows[:, None] * (D // V4_GROUP) + g[None, :],
        mask=n_mask[:, None] & (g[None, :] < D // V4_GROUP),
        other=0.0,
    ).to(DTYPE)
    v = tl.reshape(v, (rows.shape[0], GROUPS, V4_GROUP)) * scale[:, :, None]
    return tl.reshape(v, (rows.shape[0], BLOCK_D))


@triton.jit
def _attend(
    q,  # [ROWS, BLOCK_D] queries, pre-scaled, in DOT_DTYPE (INT8_QK: their int8 codes)
    q_scale,  # [ROWS] fp32 (INT8_QK): each query row's code scale
    q_pos,  # [ROWS] position of each query row
    start,
    end,  # the key positions [start, end) this program covers
    b,
    hk,
    block_table_ptr,
    stride_bt,
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    Hk,
    D,
    ROWS: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    V4_GROUP: tl.constexpr,
    WIDE: tl.constexpr,  # int64 cache offsets (the cache holds 2^31 elements or more)
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    INT8_QK: tl.constexpr,  # int8 K codes times int8 query codes on the integer tensor cores
):
    """Online softmax over keys [start, end), causal by q_pos. Returns (m, l, acc): acc is the unnormalised
    output [ROWS, BLOCK_D]."""
    d = tl.arange(0, BLOCK_D)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    table = block_table_ptr + b * stride_bt
    # tiles start on page boundaries (start is a multiple of BLOCK_N, a multiple of the page size), so a
    # tile is PAGES whole pages. Each step reads the next step's block table entries, into registers: a
    # tile's address then waits on no load of its own step, and the loop's software pipeline keeps the next
    # tiles' copies in flight (with the entries read in the step, every step waited for all its copies)
    PAGES: tl.constexpr = BLOCK_N // BLOCK_SIZE
    page = _pages(table, start, end, PAGES, BLOCK_SIZE)  # [PAGES]
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        rows = _slots(page, BLOCK_SIZE, WIDE) * Hk + hk  # [BLOCK_N] flat cache rows
        page = _pages(table, start_n + BLOCK_N, end, PAGES, BLOCK_SIZE)
        if INT8_QK:  # exact integer scores; the query rows' scales, then the keys', multiply them
            k = _load_codes(k_ptr, rows, n_mask, d, D, tl.int8)
            s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32) * q_scale[:, None]
        else:
            k = _load_codes(k_ptr, rows, n_mask, d, D, DOT_DTYPE)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [ROWS, BLOCK_N]
        if MODE != 0:  # int8 K: the per-token scale multiplies the scores, not the tile
            s = s * tl.load(k_scale_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        alpha = alpha[:, None]
        if MODE == 2:
            v = _load_v4(v_ptr, v_scale_ptr, rows, n_mask, D, BLOCK_D, V4_GROUP, DOT_DTYPE)
        else:
            if MODE == 1:  # int8 V: the per-token scale multiplies the probabilities
                p = p * tl.load(v_scale_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            v = _load_codes(v_ptr, rows, n_mask, d, D, DOT_DTYPE)
        acc = acc * alpha + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _store_rows(base, r_mask, acc, inv_l, D, BLOCK_D: tl.constexpr):
    """Store the normalised output rows at base [ROWS, 1] (pointers to each row's first dim)."""
    d = tl.arange(0, BLOCK_D)[None, :]
    tl.store(base + d, (acc * inv_l[:, None]).to(base.dtype.element_ty), mask=r_mask[:, None] & (d < D))


@triton.jit
def _prefill_kernel(
    q_ptr,  # [T, Hq, D]
    out_ptr,  # [T, Hq, D]
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_ptr,  # [B, max_blocks] int32
    seq_lens_ptr,  # [B] int32
    cu_seqlens_ptr,  # [B + 1] int32
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    scale,
    Hk,
    D,
    GROUP: tl.constexpr,  # Hq / Hk
    MODE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # page size
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    V4_GROUP: tl.constexpr,
    WIDE: tl.constexpr,  # int64 cache offsets (the cache holds 2^31 elements or more)
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operands of the two products: fp32, or the model's half dtype on GPU
    INT8_QK: tl.constexpr,  # int8 K cache: queries quantized per (token, head) for integer QK products
):
    b = tl.program_id(0)
    m_block = tl.program_id(1)
    hq = tl.program_id(2)
    hk = hq // GROUP
    q_start = tl.load(cu_seqlens_ptr + b)
    q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    first_pos = seq_len - q_len  # position of this sequence's first query token
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < q_len
    q_pos = first_pos + offs_m
    d = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + (q_start + offs_m)[:, None] * stride_qt + hq * stride_qh + d[None, :],
        mask=m_mask[:, None] & (d[None, :] < D),
        other=0.0,
    ).to(tl.float32)
    if INT8_QK:
        codes, q_scale = quantize_rows(q * scale, 127)
        q = codes.to(tl.int8)
    else:
        q, q_scale = (q * scale).to(DOT_DTYPE), tl.full([BLOCK_M], 1.0, tl.float32)
    # causal: keys up to the last query position of this block
    kv_end = tl.minimum(seq_len, first_pos + (m_block + 1) * BLOCK_M)
    _, l_i, acc = _attend(
        q,
        q_scale,
        q_pos,
        0,
        kv_end,
        b,
        hk,
        block_table_ptr,
        stride_bt,
        k_ptr,
        v_ptr,
        k_scale_ptr,
        v_scale_ptr,
        Hk,
        D,
        BLOCK_M,
        MODE,
        BLOCK_SIZE,
        BLOCK_N,
        BLOCK_D,
        V4_GROUP,
        WIDE,
        PRECISION,
        DOT_DTYPE,
        INT8_QK,
    )
    inv_l = 1.0 / tl.where(l_i == 0.0, 1.0, l_i)
    base = out_ptr + (q_start + offs_m)[:, None] * stride_ot + hq * stride_oh
    _store_rows(base, m_mask, acc, inv_l, D, BLOCK_D)


# NOTE: the split count is a runtime value, not specialized, so decode compiles once per model as context
# grows (it follows the block table's width, which grows with the longest sequence of an eager step)
@triton.jit(do_not_specialize=["num_splits"])
def _decode_kernel(
    q_ptr,  # [B * Q, Hq, D]: Q query tokens per sequence (1 for decode, k + 1 for verification)
    partial_ptr,  # [B * Q, Hq, num_splits, D] fp32: each split's normalised output
    lse_ptr,  # [B * Q, Hq, num_splits] fp32: each split's log-sum-exp (-inf when it saw no key)
    k_ptr,
    v_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_table_ptr,
    seq_lens_ptr,
    stride_qt,
    stride_qh,
    stride_bt,
    scale,
    Hk,
    D,
    num_splits,
    Q: tl.constexpr,
    GROUP: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_R: tl.constexpr,  # >= Q * GROUP rows: the query tokens x the q heads sharing this kv head
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    V4_GROUP: tl.constexpr,
    WIDE: tl.constexpr,  # int64 cache offsets (the cache holds 2^31 elements or more)
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operands of the two products: fp32, or the model's half dtype on GPU
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    r = tl.arange(0, BLOCK_R)
    qi = r // GROUP  # query token of the row
    hq = hk * GROUP + r % GROUP
    r_mask = r < Q * GROUP
    tok = b * Q + qi
    q_pos = seq_len - Q + qi
    d = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + hq[:, None] * stride_qh + d[None, :],
        mask=r_mask[:, None] & (d[None, :] < D),
        other=0.0,
    ).to(tl.float32)
    q = (q * scale).to(DOT_DTYPE)
    # this split's share of the keys, in whole BLOCK_N tiles
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(seq_len, start + per_split)
    m_i, l_i, acc = _attend(
        q,
        tl.full([BLOCK_R], 1.0, tl.float32),
        q_pos,
        start,
        end,
        b,
        hk,
        block_table_ptr,
        stride_bt,
        k_ptr,
        v_ptr,
        k_scale_ptr,
        v_scale_ptr,
        Hk,
        D,
        BLOCK_R,
        MODE,
        BLOCK_SIZE,
        BLOCK_N,
        BLOCK_D,
        V4_GROUP,
        WIDE,
        PRECISION,
        DOT_DTYPE,
        False,
    )
    seen = l_i > 0.0
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    num_q_heads = Hk * GROUP
    row = (tok * num_q_heads + hq) * num_splits + split  # [BLOCK_R]
    tl.store(lse_ptr + row, lse, mask=r_mask)
    _store_rows(partial_ptr + row[:, None] * D, r_mask, acc, 1.0 / tl.where(seen, l_i, 1.0), D, BLOCK_D)


@triton.jit(do_not_specialize=["num_splits"])
def _reduce_kernel(
    partial_ptr,  # [T, Hq, num_splits, D] fp32
    lse_ptr,  # [T, Hq, num_splits] fp32
    out_ptr,  # [T, Hq, D]
    stride_ot,
    stride_oh,
    Hq,
    D,
    num_splits,
    BLOCK_S: tl.constexpr,  # >= num_splits
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    row = t * Hq + h
    lse = tl.load(lse_ptr + row * num_splits + s, mask=s < num_splits, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp(lse - m)  # splits that saw no key weigh 0
    parts = tl.load(
        partial_ptr + (row * num_splits + s)[:, None] * D + d[None, :],
        mask=(s[:, None] < num_splits) & (d[None, :] < D),
        other=0.0,
    )
    o = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d < D)


def _mode(cache) -> int:
    return {"int8": _INT8, "k8v4": _K8V4}.get(cache.kv_dtype, _PLAIN)


def _wide_offsets(cache) -> bool:
    """Whether element offsets into the cache need int64: a K or V tensor of 2^31 elements or more."""
    return max(cache.k_data.numel(), cache.v_data.numel()) >= 2**31


def _common(q: torch.Tensor, cache) -> dict:
    head_dim = q.shape[2]
    dummy = cache.k_data
    return dict(
        k_ptr=cache.k_data,
        # k8v4's V is read as int32 words of eight int4 codes (_load_v4)
        v_ptr=cache.v_data.view(torch.int32) if cache.kv_dtype == "k8v4" else cache.v_data,
        k_scale_ptr=cache.k_scale if cache.k_scale is not None else dummy,
        v_scale_ptr=cache.v_scale if cache.v_scale is not None else dummy,
        MODE=_mode(cache),
        BLOCK_SIZE=cache.k_data.shape[1],
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        V4_GROUP=V4_GROUP,
        WIDE=_wide_offsets(cache),
        # fp32 models get exact fp32 products; half-precision models on a GPU multiply in their own dtype
        # (the tensor-core path); the interpreter keeps fp32
        PRECISION=dot_precision(q.dtype),
        DOT_DTYPE=dot_dtype(q.dtype),
    )


def _block_n(cache) -> int:
    """Keys per inner step: several pages at once (a page may hold as few as 4 tokens), fewer at head_dim 256."""
    return max(16, cache.k_data.shape[1], min(64, 8192 // cache.k_data.shape[3]))


WIDE_DECODE_BLOCK_N = 64


def _decode_block_n(q: torch.Tensor, cache, rows: int) -> int:
    """Keys per step of the decode kernel: _block_n's, widened to WIDE_DECODE_BLOCK_N (head_dim 256) where
    three pipeline stages of the wider tile fit the GPU's shared memory (SM 9.0: ~144 of 227 KB; not the
    99 KB of SM 8.6 / 8.9, nor the interpreter). An H200 (2026-12-04, CUDA graph replay, 24q / 4kv x 256 at
    32K) decoded a bf16 cache in 38.5 us with 64 keys a step against 45.6 with 32, a k8v4 one in 46.1
    against 54.0 (docs/benchmarks.md): twice the bytes in flight a program. 8- / 4-bit caches widen only
    for one query token a sequence (16 rows): the verification tile of 32 rows would spill registers
    dequantizing 64 keys (scripts/cuda_compile_check.py, SM 9.0)."""
    narrow = _block_n(cache)
    wide = max(narrow, WIDE_DECODE_BLOCK_N)
    fits = _num_stages(q, cache, wide, rows) == 3 and (cache.kv_dtype in SIXTEEN_BIT_KV or rows <= 16)
    return wide if wide > narrow and fits else narrow


WIDE_PREFILL_MIN_TOKENS = 2048  # query tokens a step from which 128-row tiles still give 16 per head


def _wide_prefill_tile(q: torch.Tensor, cache, block_n: int) -> bool:
    """128 query rows and 8 warps a program instead of 32 and 4: on SM 9.0+, for 16-bit queries over a
    16-bit cache, in a step of WIDE_PREFILL_MIN_TOKENS+ query tokens, where three pipeline stages of the
    wide tile fit the GPU's shared memory. An H200 ran an 8K causal prompt (24q / 4kv x 256, bf16) in 3.0 ms
    so, 5.9 ms with the narrow tile (2026-12-04, docs/benchmarks.md); smaller steps keep the narrow tile,
    whose programs fill the SMs. An RTX 5090 (SM 12.0, 99 KB) keeps it at head_dim 256: the wide tile
    needs 104 KB there even at two stages (scripts/cuda_compile_check.py, prefill_long). Under the
    interpreter compute_capability is 0: never wide."""
    return (
        q.shape[0] >= WIDE_PREFILL_MIN_TOKENS
        and q.dtype in (torch.bfloat16, torch.float16)
        and cache.kv_dtype in SIXTEEN_BIT_KV
        and compute_capability(q.device) >= 90
        and _num_stages(q, cache, block_n, 128) == 3
    )


def _key_tile(cache, block_n: int | None) -> int:
    """Keys per inner step (block_n, or _block_n's default): a whole number of pages, which _attend reads
    page by page."""
    page = cache.k_data.shape[1]
    if page & (page - 1):
        raise ValueError(
            f"the Triton attention kernels need a power-of-two page size (block_size); got {page}"
        )
    block_n = block_n or _block_n(cache)
    if block_n % page or block_n & (block_n - 1):
        raise ValueError(
            f"block_n must be a power of two and a multiple of the page size {page}; got {block_n}"
        )
    return block_n


def _num_stages(q: torch.Tensor, cache, block_n: int, rows: int) -> int:
    """Depth of the key loop's software pipeline (triton_config.pipeline_stages): two for fp32 caches, and
    for 64-row prefill tiles at head_dim 256, on 99 KB consumer GPUs; three elsewhere. Need for three: the
    [rows, D] query operand, 8 KB of staging, and a K + V tile as stored per stage beyond the first; tiles
    of 64+ rows take one more (Hopper's wgmma reads its operands from shared memory, so the tile being
    computed keeps its buffer). Within ~10% of what Triton 3.9 allocates, above it
    (scripts/cuda_compile_check.py reports the figures)."""
    tile = block_n * sum(t.shape[3] * t.element_size() for t in (cache.k_data, cache.v_data))
    need = (3 if rows >= 64 else 2) * tile + rows * q.shape[2] * q.element_size() + 8192
    return pipeline_stages(need, q.device)


def paged_attention_decode(
    q: torch.Tensor,  # [B * Q, Hq, D]: Q tokens per sequence, the last Q positions of each
    cache,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
    q_per_seq: int = 1,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Split-K decode attention (flash-decoding); q_per_seq = k + 1 serves speculative verification.
    num_splits (default: num_decode_splits of the block table's width), block_n (keys a step, whole pages;
    default _decode_block_n), num_warps and num_stages (default: _num_stages) are tuning knobs for
    benchmarks/gpu_kernels.py's sweep."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs, num_kv_heads = block_table.shape[0], cache.k_data.shape[2]
    assert num_tokens == num_seqs * q_per_seq and q.stride(-1) == 1 and cache.k_data.is_contiguous()
    group = num_q_heads // num_kv_heads
    # NOTE: from the block table's width (a host-side shape), so no device sync picks the split count
    splits = num_splits or num_decode_splits(block_table.shape[1] * cache.k_data.shape[1], cache.kv_dtype)
    block_r = max(16, triton.next_power_of_2(q_per_seq * group))
    block_n = _key_tile(cache, block_n or _decode_block_n(q, cache, block_r))
    out = torch.empty_like(q)
    partial = torch.empty((num_tokens, num_q_heads, splits, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((num_tokens, num_q_heads, splits), dtype=torch.float32, device=q.device)
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        q_ptr=q,
        partial_ptr=partial,
        lse_ptr=lse,
        block_table_ptr=block_table,
        seq_lens_ptr=seq_lens,
        stride_qt=q.stride(0),
        stride_qh=q.stride(1),
        stride_bt=block_table.stride(0),
        scale=scale,
        Hk=num_kv_heads,
        D=head_dim,
        num_splits=splits,
        Q=q_per_seq,
        GROUP=group,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        num_warps=num_warps,
        num_stages=num_stages or _num_stages(q, cache, block_n, block_r),
        **_common(q, cache),
    )
    return combine_splits(partial, lse, out, max_decode_splits(cache.kv_dtype))


def combine_splits(
    partial: torch.Tensor,  # [T, Hq, splits, D] fp32: each split's normalised output
    lse: torch.Tensor,  # [T, Hq, splits] fp32: each split's log-sum-exp
    out: torch.Tensor,  # [T, Hq, D]
    max_splits: int = MAX_DECODE_SPLITS,
) -> torch.Tensor:
    """The decode's second kernel: every split's output weighted by its share of the softmax, into out.
    max_splits: the most the cache's KV dtype is split into (max_decode_splits), so that one compiled
    kernel serves every context length."""
    num_tokens, num_q_heads, splits, head_dim = partial.shape
    _reduce_kernel[(num_tokens, num_q_heads)](
        partial,
        lse,
        out,
        out.stride(0),
        out.stride(1),
        num_q_heads,
        head_dim,
        splits,
        BLOCK_S=triton.next_power_of_2(max(max_splits, splits)),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
    return out


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    cache,
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32
    scale: float,
    *,
    query_tokens_per_seq: int = 0,
    int8_queries: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """See kernels/paged_attention/naive.py. One token per sequence (T == B), or the same few per sequence
    (query_tokens_per_seq, a host int: speculative verification) takes the split-K decode kernel;
    anything else the prefill kernel (block_m, block_n, num_warps, num_stages: its tile and pipeline
    depth, tuning knobs for benchmarks/gpu_kernels.py's sweep). int8_queries (--int8-prefill): over an
    int8 / k8v4 cache the prefill kernel quantizes each query row to int8 and multiplies it by the int8 K
    codes on the integer tensor cores (decode and verification keep 16-bit queries)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = block_table.shape[0]
    group = num_q_heads // cache.k_data.shape[2]
    if takes_decode_kernel(num_tokens, num_seqs, query_tokens_per_seq, group):
        return paged_attention_decode(q, cache, block_table, seq_lens, scale, num_tokens // num_seqs)
    assert q.stride(-1) == 1 and cache.k_data.is_contiguous()
    out = torch.empty_like(q)
    num_kv_heads = cache.k_data.shape[2]
    block_n = _key_tile(cache, block_n)
    wide = _wide_prefill_tile(q, cache, block_n)
    block_m, num_warps = block_m or (128 if wide else 32), num_warps or (8 if wide else 4)
    # NOTE: T bounds every sequence's query count, so the grid needs no device sync
    _prefill_kernel[(num_seqs, triton.cdiv(num_tokens, block_m), num_q_heads)](
        q_ptr=q,
        out_ptr=out,
        block_table_ptr=block_table,
        seq_lens_ptr=seq_lens,
        cu_seqlens_ptr=cu_seqlens_q,
        stride_qt=q.stride(0),
        stride_qh=q.stride(1),
        stride_ot=out.stride(0),
        stride_oh=out.stride(1),
        stride_bt=block_table.stride(0),
        scale=scale,
        Hk=num_kv_heads,
        D=head_dim,
        GROUP=num_q_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        num_stages=num_stages or _num_stages(q, cache, block_n, block_m),
        INT8_QK=int8_queries and _mode(cache) != _PLAIN,
        **_common(q, cache),
    )
    return out
