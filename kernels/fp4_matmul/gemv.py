"""The FP4 GEMV at M = 1 on the CUDA cores (a single sequence's decode step).

Each program takes BLOCK_N weight rows and a slice of K; each thread keeps its rows' int32 words (eight
codes, columns 8t..8t+7) in registers as loaded. Codes j and j + 4 of a word (j = 0..3) become the fp16
pair e2m1 x 2^-14 in one register's two halves by two shifts and two masks: the magnitude bits (2-0 of each
nibble, at bits 4j and 16 + 4j) to bits 9-11 and 25-27, the sign bits (3) to 15 and 31; each half then
converts to fp32 exactly (kernels/triton_codes.py: e2m1_pairs). So a code costs two instructions of the pair's
four, a conversion and an FMA into its word's sum; the words' sums take their group's scale (e4m3 or e8m0,
decoded by bit operations once a word) as one FMA into an fp32 [BLOCK_N, WORDS] total, summed across the
words once, at the end, where each row's multiplier (with the powers of two the codes and scales were read
with) applies. Split-K as the other GEMVs (kernels/quant_matmul/split_k.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.gemv4 import _rows_and_slice, _store_rows, _word_columns, _x
from ninfer_kernels.triton_codes import e2m1_pairs, fp4_row_scales, fp4_scales


@triton.jit
def _scales(
    scales_ptr,
    rows_in,
    num_groups,
    k0,
    WORDS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    E8M0: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """Each word's group scale ([BLOCK_N, WORDS] fp32: 2^(s - 127), or e4m3 x 2^-8), its byte loaded once a
    word (a group's words read the same byte); past the last group (not EVEN_K) 0."""
    g = k0 // GROUP_SIZE + tl.arange(0, WORDS) // (GROUP_SIZE // 8)
    where = scales_ptr + rows_in[:, None] * num_groups + g[None, :]
    if EVEN_K:
        s = tl.load(where).to(tl.int32)
    else:
        s = tl.load(where, mask=(g < num_groups)[None, :], other=0).to(tl.int32)
    return fp4_scales(s, E8M0)


@triton.jit
def step_words(packed_ptr, rows_in, row_words, k0, WORDS: tl.constexpr, EVEN_K: tl.constexpr):
    """The int32 words [BLOCK_N, WORDS] of rows rows_in from column k0 (not EVEN_K: past K, zero codes)."""
    t = tl.arange(0, WORDS)
    where = packed_ptr + rows_in[:, None] * row_words + (k0 // 8 + t)[None, :]
    if EVEN_K:
        return tl.load(where)
    return tl.load(where, mask=(k0 // 8 + t < row_words)[None, :], other=0)


@triton.jit
def fp4_gemv_cuda_cores_kernel(
    x_ptr,  # [1, K]
    packed_ptr,  # int32 [N, K / 8]: eight codes a word
    scales_ptr,  # uint8 [N, G]
    mult_ptr,  # fp32 [N]
    out_ptr,  # [1, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    N,
    K,
    row_words,  # K / 8
    num_groups,
    STEPS_PER_SPLIT,
    GROUP_SIZE: tl.constexpr,
    E8M0: tl.constexpr,
    STEP: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of STEP
):
    WORDS: tl.constexpr = STEP // 8
    offs_n, n_mask, rows_in, k_start, k_end = _rows_and_slice(N, K, STEPS_PER_SPLIT, STEP, BLOCK_N)
    total = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for k0 in range(k_start, k_end, STEP):
        word = step_words(packed_ptr, rows_in, row_words, k0, WORDS, EVEN_K)
        x8 = tl.reshape(_x(x_ptr, k0 + tl.arange(0, STEP), K, EVEN_K, x_ptr, False), [WORDS, 8])
        x0, x1, x2, x3, x4, x5, x6, x7 = _word_columns(x8, WORDS)
        c0, c4 = e2m1_pairs(word, 9, 12)  # nibbles 0 and 4: magnitudes at bits 0 and 16, signs at 3 and 19
        s = tl.fma(c4, x4[None, :], c0 * x0[None, :])
        c1, c5 = e2m1_pairs(word, 5, 8)
        s = tl.fma(c1, x1[None, :], tl.fma(c5, x5[None, :], s))
        c2, c6 = e2m1_pairs(word, 1, 4)
        s = tl.fma(c2, x2[None, :], tl.fma(c6, x6[None, :], s))
        c3, c7 = e2m1_pairs(word, -3, 0)
        s = tl.fma(c3, x3[None, :], tl.fma(c7, x7[None, :], s))
        scale = _scales(scales_ptr, rows_in, num_groups, k0, WORDS, GROUP_SIZE, E8M0, EVEN_K)
        total = tl.fma(s, scale, total)
    row_total = tl.zeros([BLOCK_N], tl.float32)
    total = total * fp4_row_scales(mult_ptr, rows_in, E8M0)[:, None]
    _store_rows(total, row_total, offs_n, n_mask, out_ptr, sums_ptr, arrivals_ptr, SPLIT_K)
