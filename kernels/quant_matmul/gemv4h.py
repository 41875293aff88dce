"""The 4-bit GEMV for 1-4 activation rows in packed half precision: two codes an instruction (a knob:
quant_matmul(..., half2=True), GEMV_HALF2; 16-bit activations only).

gemv4.py spends an AND-OR and an FMA on every code. Here a pair of codes shares them: a half's mantissa
unit is 1 at bit 6 of 16.0 (0x4C00), so a nibble masked in place at bits 6-9 of each half of a 32-bit word
and OR-ed with 16.0 in both halves reads as the pair (16 + c_j, 16 + c_j+4), and one f16x2 FMA multiplies
it by the activation pair (x_j, x_j+4). A word's nibble j sits at bit 4j and nibble j + 4 at bit 16 + 4j:
one shift brings both to bits 6 and 22 (left by 6, 2; right by 2, 6). Per word: four shifts, four
AND-ORs, four f16x2 FMAs; per two words (a row's chain of eight FMAs), the two halves' sum in fp32 and the
scale as an fp32 FMA; the minimum (less 16 scales) once a row a group, times the group's activation sum
(as gemv4.py). Two or four activation rows (C2-C4 decode, speculative verification's k + 1 tokens;
three run as four, the fourth reading the third again and storing nothing) share a program: the word
pairs' codes are converted once and each row adds its own chains (1 / 2 / 4 rows: 136 / 197 / 320
instructions per KB at 128 weight rows, 72 / 128 / 254 registers, SM 9.0 under Triton 3.9; 150 / 220 / 360
under 3.6). The activation pairs are loaded as flat vectors, scaled and packed there, one pair a thread,
before they reach the words' layout (as a [words, 4] tile, Triton 3.6 had every thread load, convert
and pack its own columns: 194 per KB at one row).

Half precision bounds it. The offset 16 is of the codes' own size (gemv4.py's 2^11 would leave fp16
nothing), so the products keep ~10 bits. Each program scales its K slice's activations by the power of
two 2^p that brings their largest magnitude into [32, 64) (from its exponent bits: one load of the slice
and a max before the loop), so that a chain's eight products a half stay below fp16's 65504 (8 * 31 * 64)
and small activations stay clear of fp16's subnormals, whatever their magnitude; the fp32 total is scaled
back at the end. With s = sum_e x'_e (16 + c_e), x' = 2^p x:

    sum_e x_e (scale c_e + min) = 2^-p (scale s + (min - 16 scale) sum_e x'_e)

Error: fp16 rounding of x' and of the chains' partial sums: 3-4e-3 RMS-relative with fp16 outputs for
activations of either sign, 7e-3 for activations all positive (the offsets' sums then grow without
cancelling; gemv4.py: 2e-4), 3.6-5.1e-3 and 7.5e-3 with bf16 outputs (gemv4.py: 2.9-3.6e-3, bf16's own
rounding). Chains of four words (16 products a half) would save 12 instructions a step and double the
error. fp32 activations take gemv4.py. f16x2 arithmetic is inline PTX; under the interpreter (EMULATE) the
same operations run on the halves unpacked to fp32 and rounded back to fp16.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.gemv4 import _group_column, _rows_and_slice, _x
from ninfer_kernels.quant_matmul.split_k import split_k_store

HALF_MAGIC = 0x4C004C00  # 16.0 in both halves; an argument, as gemv4.py's magics are
PAIR_MASK = tl.constexpr(0x03C003C0)  # bits 6-9 of each half


@triton.jit
def _lo(v):
    """The low half of int32 v as fp32."""
    return (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _hi(v):
    """The high half of int32 v as fp32."""
    return (v >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _pack(lo, hi):
    """fp32 lo and hi rounded to fp16 and packed into an int32 (lo in the low half)."""
    lo16 = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo16 | (hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _half2(lo, hi, EMULATE: tl.constexpr):
    """fp32 lo, hi as one f16x2 int32 (lo in the low half). Marked impure, so the compiler packs where the
    values load instead of in every thread that reads them (Triton 3.9: 307 -> 290 instructions a step)."""
    if EMULATE:
        return _pack(lo, hi)
    return tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", [hi, lo], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _hfma2(a, b, c, EMULATE: tl.constexpr):
    """a * b + c on both halves of f16x2 int32s."""
    if EMULATE:
        return _pack(_lo(a) * _lo(b) + _lo(c), _hi(a) * _hi(b) + _hi(c))
    return tl.inline_asm_elementwise(
        "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _sum2(v, EMULATE: tl.constexpr):
    """The two halves of an f16x2 int32 added in fp32."""
    if EMULATE:
        return _lo(v) + _hi(v)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 l, h; .reg .f32 a, b; mov.b32 {l, h}, $1; cvt.f32.f16 a, l; cvt.f32.f16 b, h; "
        "add.f32 $0, a, b; }",
        "=f,r",
        [v],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _pairs(src, magic):
    """The nibbles at bits 6-9 and 22-25 of src (uint32) as the f16x2 (16 + c, 16 + c') (int32)."""
    return ((src & PAIR_MASK) | magic).to(tl.int32, bitcast=True)


@triton.jit
def _power_of_two_scale(amax):
    """2^p and 2^-p that bring amax (fp32 >= 0) into [32, 64): p from its exponent bits alone (exact,
    clamped to fp32's normal range: amax 0 gives 2^127)."""
    biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    p = tl.minimum(tl.maximum(259 - biased, 1), 254)  # 2^(5 - e) for amax = 2^e m, biased
    return (p << 23).to(tl.float32, bitcast=True), ((254 - p) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _word_pairs(v, ROWS: tl.constexpr, HALF: tl.constexpr):
    """v [ROWS, 2 HALF] (or [2 HALF] when ROWS is 0) split into its even and odd words ([ROWS, HALF])."""
    if ROWS == 0:
        even, odd = tl.split(tl.reshape(v, [HALF, 2]))
    else:
        even, odd = tl.split(tl.reshape(v, [ROWS, HALF, 2]))
    return even, odd


@triton.jit
def _word(w, p0, p1, p2, p3, s, magic, EMULATE: tl.constexpr):
    """s plus a word's eight products: its nibbles j, j + 4 (w [BLOCK_N, HALF]) times the pairs pj [HALF]."""
    # nibbles j and j + 4 (bits 4j, 16 + 4j) to bits 6 and 22: left by 6, 2, right by 2, 6
    s = _hfma2(_pairs(w << 6, magic), p0[None, :], s, EMULATE)
    s = _hfma2(_pairs(w << 2, magic), p1[None, :], s, EMULATE)
    s = _hfma2(_pairs(w >> 2, magic), p2[None, :], s, EMULATE)
    return _hfma2(_pairs(w >> 6, magic), p3[None, :], s, EMULATE)


@triton.jit
def _activation_row(
    x_row,
    k0,
    K,
    x_scale,
    w0,
    w1,
    magic,
    columns_ptr,
    WORDS: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
    EMULATE: tl.constexpr,
):
    """One activation row's step over a group: its chains' sums (fp32 [BLOCK_N, WORDS / 2]: sum_e x'_e (16 +
    c_e) over each row's word pair) and the group's activation sum sum_e x'_e (fp32), x' = x_scale x."""
    HALF: tl.constexpr = WORDS // 2
    # the activation pairs (x_j, x_j+4) of each word, scaled and packed where they load ([WORDS, 4])
    i = tl.arange(0, 4 * WORDS)  # (word i // 4, column i % 4)
    lo = k0 + (i // 4) * 8 + i % 4
    x_lo = _x(x_row, lo, K, EVEN_K, columns_ptr, HAS_COLUMNS) * x_scale
    x_hi = _x(x_row, lo + 4, K, EVEN_K, columns_ptr, HAS_COLUMNS) * x_scale
    xs = tl.sum(x_lo + x_hi, axis=0)  # sum x'
    pairs = tl.reshape(_half2(x_lo, x_hi, EMULATE), [WORDS, 4])
    even, odd = tl.split(tl.reshape(pairs, [WORDS, 2, 2]))  # j = 0, 2 and 1, 3
    q0, q2 = tl.split(even)
    q1, q3 = tl.split(odd)
    # a chain of eight f16x2 FMAs a weight row and word pair: words 2h, 2h + 1 (w0, w1: [BLOCK_N, HALF]) and
    # their activation pairs ([HALF] each)
    a0, b0 = _word_pairs(q0, 0, HALF)
    a1, b1 = _word_pairs(q1, 0, HALF)
    a2, b2 = _word_pairs(q2, 0, HALF)
    a3, b3 = _word_pairs(q3, 0, HALF)
    s = _word(w0, a0, a1, a2, a3, tl.zeros(w0.shape, tl.int32), magic, EMULATE)  # from (0, 0)
    s = _word(w1, b0, b1, b2, b3, s, magic, EMULATE)
    return _sum2(s, EMULATE), xs


@triton.jit
def _row_scale(x_row, k_start, k_end, columns_ptr, SLICE: tl.constexpr, HAS_COLUMNS: tl.constexpr):
    """x_scale, x_unscale of an activation row's K slice (_power_of_two_scale of its largest magnitude)."""
    kk = k_start + tl.arange(0, SLICE)
    return _power_of_two_scale(tl.max(tl.abs(_x(x_row, kk, k_end, False, columns_ptr, HAS_COLUMNS))))


@triton.jit(do_not_specialize=["half_magic"])
def gemv4_half2_kernel(
    x_ptr,  # [M, K] fp16 / bf16
    packed_ptr,  # int32 [N, row_words]: eight 4-bit codes a word
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G]
    out_ptr,  # [M, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [M, N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    columns_ptr,  # HAS_COLUMNS: int32 [K], the input column each stored column holds (act-order)
    M,
    N,
    K,
    stride_xm,
    stride_om,
    row_words,  # KP / 8
    num_groups,
    GROUPS_PER_SPLIT,
    half_magic,  # HALF_MAGIC
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS_X: tl.constexpr,  # 1, 2 or 4 >= M: activation rows a program (past M: row M - 1 again, not stored)
    EVEN_K: tl.constexpr,  # K a multiple of GROUP_SIZE
    STAGES: tl.constexpr,
    SLICE: tl.constexpr,  # a power of two >= GROUPS_PER_SPLIT * GROUP_SIZE: the slice's activations at once
    EMULATE: tl.constexpr,  # the interpreter: no inline PTX
    HAS_COLUMNS: tl.constexpr,
):
    WORDS: tl.constexpr = GROUP_SIZE // 8
    HALF: tl.constexpr = WORDS // 2
    offs_n, n_mask, rows_in, k_start, k_end = _rows_and_slice(N, K, GROUPS_PER_SPLIT, GROUP_SIZE, BLOCK_N)
    t = tl.arange(0, WORDS)
    magic = half_magic.to(tl.uint32, bitcast=True)
    rows = packed_ptr + rows_in[:, None] * row_words + t[None, :]  # [BLOCK_N, WORDS]: a group's words at k 0
    # each activation row: its pointer, its slice's scale, its totals (fp32 [BLOCK_N, HALF] and [BLOCK_N])
    x_0 = x_ptr
    x_1 = x_ptr + tl.minimum(1, M - 1) * stride_xm
    x_2 = x_ptr + tl.minimum(2, M - 1) * stride_xm
    x_3 = x_ptr + tl.minimum(3, M - 1) * stride_xm
    scale_0, unscale_0 = _row_scale(x_0, k_start, k_end, columns_ptr, SLICE, HAS_COLUMNS)
    scale_1, unscale_1 = scale_0, unscale_0
    scale_2, unscale_2 = scale_0, unscale_0
    scale_3, unscale_3 = scale_0, unscale_0
    if ROWS_X >= 2:
        scale_1, unscale_1 = _row_scale(x_1, k_start, k_end, columns_ptr, SLICE, HAS_COLUMNS)
    if ROWS_X >= 4:
        scale_2, unscale_2 = _row_scale(x_2, k_start, k_end, columns_ptr, SLICE, HAS_COLUMNS)
        scale_3, unscale_3 = _row_scale(x_3, k_start, k_end, columns_ptr, SLICE, HAS_COLUMNS)
    total_0 = tl.zeros([BLOCK_N, HALF], tl.float32)
    total_1, total_2, total_3 = total_0, total_0, total_0
    row_total_0 = tl.zeros([BLOCK_N], tl.float32)
    row_total_1, row_total_2, row_total_3 = row_total_0, row_total_0, row_total_0
    for k0 in tl.range(k_start, k_end, GROUP_SIZE, num_stages=STAGES):
        group = k0 // GROUP_SIZE
        word = tl.load(rows + k0 // 8).to(tl.uint32, bitcast=True)
        w0, w1 = _word_pairs(word, BLOCK_N, HALF)  # (their pairs' codes shared by the activation rows)
        scale = _group_column(scales_ptr, rows_in, num_groups, group)  # [BLOCK_N]
        if HAS_MINS:  # (min - 16 scale) sum_k x'_k over the group: once a row
            shift = tl.fma(scale, -16.0, _group_column(mins_ptr, rows_in, num_groups, group))
        else:
            shift = scale * -16.0
        s, xs = _activation_row(
            x_0, k0, K, scale_0, w0, w1, magic, columns_ptr, WORDS, EVEN_K, HAS_COLUMNS, EMULATE
        )
        total_0, row_total_0 = tl.fma(s, scale[:, None], total_0), tl.fma(shift, xs, row_total_0)
        if ROWS_X >= 2:
            s, xs = _activation_row(
                x_1, k0, K, scale_1, w0, w1, magic, columns_ptr, WORDS, EVEN_K, HAS_COLUMNS, EMULATE
            )
            total_1, row_total_1 = tl.fma(s, scale[:, None], total_1), tl.fma(shift, xs, row_total_1)
        if ROWS_X >= 4:
            s, xs = _activation_row(
                x_2, k0, K, scale_2, w0, w1, magic, columns_ptr, WORDS, EVEN_K, HAS_COLUMNS, EMULATE
            )
            total_2, row_total_2 = tl.fma(s, scale[:, None], total_2), tl.fma(shift, xs, row_total_2)
            s, xs = _activation_row(
                x_3, k0, K, scale_3, w0, w1, magic, columns_ptr, WORDS, EVEN_K, HAS_COLUMNS, EMULATE
            )
            total_3, row_total_3 = tl.fma(s, scale[:, None], total_3), tl.fma(shift, xs, row_total_3)
    # each row's sums back by its x_unscale, as [ROWS_X, BLOCK_N]
    acc_0 = (tl.sum(total_0, axis=1) + row_total_0) * unscale_0
    acc_1 = (tl.sum(total_1, axis=1) + row_total_1) * unscale_1
    acc_2 = (tl.sum(total_2, axis=1) + row_total_2) * unscale_2
    acc_3 = (tl.sum(total_3, axis=1) + row_total_3) * unscale_3
    if ROWS_X == 1:
        acc = acc_0[None, :]
    elif ROWS_X == 2:
        acc = tl.trans(tl.join(acc_0, acc_1))
    else:  # [BLOCK_N, 2, 2]: (i, j) is row 2i + j
        acc = tl.trans(tl.reshape(tl.join(tl.join(acc_0, acc_2), tl.join(acc_1, acc_3)), [BLOCK_N, 4]))
    offs_m = tl.arange(0, ROWS_X)
    mask = (offs_m[:, None] < M) & n_mask[None, :]
    dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    sums = sums_ptr + offs_m[:, None] * N + offs_n[None, :]
    split_k_store(acc, mask, dst, sums, arrivals_ptr, tl.program_id(1), SPLIT_K)
