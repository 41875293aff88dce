"""The 4-bit GEMV at M = 1 in packed half precision: two codes an instruction (a knob: quant_matmul(...,
half2=True); 16-bit activations only).

gemv4.py spends an AND-OR and an FMA on every code. Here a pair of codes shares them: a half's mantissa
unit is 1 at bit 6 of 16.0 (0x4C00), so a nibble masked in place at bits 6-9 of each half of a 32-bit word
and OR-ed with 16.0 in both halves reads as the pair (16 + c_j, 16 + c_j+4), and one f16x2 FMA multiplies
it by the activation pair (x_j, x_j+4). A word's nibble j sits at bit 4j and nibble j + 4 at bit 16 + 4j:
one shift brings both to bits 6 and 22 (left by 6, 2; right by 2, 6). Per word: four shifts, four
AND-ORs, four f16x2 FMAs, the two halves' sum in fp32 and the scale as an fp32 FMA; the minimum (less 16
scales) once a row a group, times the group's activation sum (as gemv4.py).

Half precision bounds it. The offset 16 is of the codes' own size (gemv4.py's 2^11 would leave fp16 nothing),
so the products keep ~10 bits; the activations are taken at 2^-8 (exact) so that a word's four products a
half stay below fp16's 65504 for |x| up to ~130,000, and the fp32 total is scaled back at the end. With
s = sum_e x'_e (16 + c_e), x' = 2^-8 x:

    sum_e x_e (scale c_e + min) = 2^8 (scale s + (min - 16 scale) sum_e x'_e)

Error: fp16 rounding of x' and of each word's partial sums: 2.4-3.8e-3 RMS-relative with fp16 outputs
(gemv4.py: 3e-4), 4.6-5.7e-3 with bf16 outputs (3.4-3.9e-3: bf16's own rounding dominates). fp32
activations take gemv4.py. f16x2 arithmetic is inline PTX; under the interpreter (EMULATE) the same
operations run on the halves unpacked to fp32 and rounded back to fp16.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.gemv4 import _group_column, _rows_and_slice, _store_rows, _word_columns, _x

HALF_MAGIC = 0x4C004C00  # 16.0 in both halves; an argument, as gemv4.py's magics are
PAIR_MASK = tl.constexpr(0x03C003C0)  # bits 6-9 of each half
X_SCALE = tl.constexpr(2.0**-8)  # (exact; undone by 256 at the end)


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
    """fp32 lo, hi as one f16x2 int32 (lo in the low half)."""
    if EMULATE:
        return _pack(lo, hi)
    return tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", [hi, lo], dtype=tl.int32, is_pure=True, pack=1
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


@triton.jit(do_not_specialize=["half_magic"])
def gemv4_half2_kernel(
    x_ptr,  # [1, K] fp16 / bf16
    packed_ptr,  # int32 [N, row_words]: eight 4-bit codes a word
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G]
    out_ptr,  # [1, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    N,
    K,
    row_words,  # KP / 8
    num_groups,
    GROUPS_PER_SPLIT,
    half_magic,  # HALF_MAGIC
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of GROUP_SIZE
    STAGES: tl.constexpr,
    EMULATE: tl.constexpr,  # the interpreter: no inline PTX
):
    WORDS: tl.constexpr = GROUP_SIZE // 8
    offs_n, n_mask, k_start, k_end = _rows_and_slice(N, K, GROUPS_PER_SPLIT, GROUP_SIZE, BLOCK_N)
    t = tl.arange(0, WORDS)
    magic = half_magic.to(tl.uint32, bitcast=True)
    total = tl.zeros([BLOCK_N, WORDS], tl.float32)
    row_total = tl.zeros([BLOCK_N], tl.float32)
    rows = packed_ptr + offs_n[:, None] * row_words + t[None, :]  # [BLOCK_N, WORDS]: a group's words at k 0
    for k0 in tl.range(k_start, k_end, GROUP_SIZE, num_stages=STAGES):
        group = k0 // GROUP_SIZE
        word = tl.load(rows + k0 // 8, mask=n_mask[:, None], other=0).to(tl.uint32, bitcast=True)
        x8 = _x(x_ptr, (k0 + t * 8)[:, None] + tl.arange(0, 8)[None, :], K, EVEN_K) * X_SCALE  # [WORDS, 8]
        x0, x1, x2, x3, x4, x5, x6, x7 = _word_columns(x8, WORDS)
        xs = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))  # [WORDS]: sum x'
        # nibbles j and j + 4 (bits 4j, 16 + 4j) to bits 6 and 22: left by 6, 2, right by 2, 6
        s = tl.zeros([BLOCK_N, WORDS], tl.int32)  # f16x2 (0, 0)
        s = _hfma2(_pairs(word << 6, magic), _half2(x0, x4, EMULATE)[None, :], s, EMULATE)
        s = _hfma2(_pairs(word << 2, magic), _half2(x1, x5, EMULATE)[None, :], s, EMULATE)
        s = _hfma2(_pairs(word >> 2, magic), _half2(x2, x6, EMULATE)[None, :], s, EMULATE)
        s = _hfma2(_pairs(word >> 6, magic), _half2(x3, x7, EMULATE)[None, :], s, EMULATE)
        scale = _group_column(scales_ptr, offs_n, n_mask, num_groups, group)
        total = tl.fma(_sum2(s, EMULATE), scale[:, None], total)  # scale sum_e x'_e (16 + c_e)
        if HAS_MINS:  # (min - 16 scale) sum_k x'_k over the group: once a row
            shift = tl.fma(scale, -16.0, _group_column(mins_ptr, offs_n, n_mask, num_groups, group))
        else:
            shift = scale * -16.0
        row_total = tl.fma(shift, tl.sum(xs, axis=0), row_total)
    # (x' = 2^-8 x: the sums times 2^8)
    _store_rows(total * 256.0, row_total * 256.0, offs_n, n_mask, out_ptr, sums_ptr, arrivals_ptr, SPLIT_K)
