"""The 6-bit GEMV at M = 1 on the CUDA cores, in the way of gemv4.py.

A row's codes come sixteen to three int32 words (four little-endian 24-bit words, code j of 24-bit word i
at bit 6j: code k of the chunk at bit 6k of the 96 bits). A shift (a funnel shift of two words where a pair
straddles them) brings codes 2m and 2m + 1 to bits 11 and 17 at once; masked in place and OR-ed with the
exponent bits of 2^12 or 2^6 they read as 2^12 + c and 2^6 + c exactly, and each chunk's sum starts at
minus the offsets (2^12 for the even columns, 2^6 for the odd ones), as gemv4.py's does:

    sum_k x_k c_k = sum_k x_k float(c_k << P_k | 2^(23 - P_k)) - (2^12 sum_even x + 2^6 sum_odd x)

Per code one AND-OR and one FMA, per two codes one shift; per chunk the group's scale as an FMA into an
fp32 [BLOCK_N, chunks] total, the minimum once a row a group (times the group's activation sum, as
gemv4.py), summed once at the end; split-K through split_k.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.gemv4 import _group_column, _rows_and_slice, _store_rows, _x

# the exponent bits of 2^12 and 2^6 (codes at bits 11 and 17), passed as arguments as gemv4.py's are
MAGIC_11 = 0x45800000
MAGIC_17 = 0x42800000


@triton.jit
def _pair(s, src, xe, xo, m11, m17):
    """s + the codes at bits 11 and 17 of src (uint32) times their activations xe, xo ([CHUNKS])."""
    s = tl.fma(_code6(src, 11, m11), xe[None, :], s)
    return tl.fma(_code6(src, 17, m17), xo[None, :], s)


@triton.jit
def _code6(src, P: tl.constexpr, magic):
    """The codes at bits P..P+5 of the words src (uint32) as floats 2^(23 - P) + c: one AND-OR each."""
    return ((src & (63 << P)) | magic).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["magic_11", "magic_17"])
def gemv6_cuda_cores_kernel(
    x_ptr,  # [1, K]
    packed_ptr,  # int32 [N, row_words]: three words a chunk of sixteen 6-bit codes
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G]
    out_ptr,  # [1, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    columns_ptr,  # HAS_COLUMNS: int32 [K], the input column each stored column holds (act-order)
    N,
    K,
    row_words,  # 3 KP / 16
    num_groups,
    GROUPS_PER_SPLIT,
    magic_11,  # MAGIC_11
    magic_17,  # MAGIC_17
    GROUP_SIZE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of GROUP_SIZE
    STAGES: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
):
    CHUNKS: tl.constexpr = GROUP_SIZE // 16
    offs_n, n_mask, rows_in, k_start, k_end = _rows_and_slice(N, K, GROUPS_PER_SPLIT, GROUP_SIZE, BLOCK_N)
    c = tl.arange(0, CHUNKS)
    m11 = magic_11.to(tl.uint32, bitcast=True)
    m17 = magic_17.to(tl.uint32, bitcast=True)
    total = tl.zeros([BLOCK_N, CHUNKS], tl.float32)
    row_total = tl.zeros([BLOCK_N], tl.float32)
    for k0 in tl.range(k_start, k_end, GROUP_SIZE, num_stages=STAGES):
        group = k0 // GROUP_SIZE
        row = packed_ptr + rows_in[:, None] * row_words + (k0 * 3 // 16 + 3 * c)[None, :]  # [BLOCK_N, CHUNKS]
        w0 = tl.load(row).to(tl.uint32, bitcast=True)
        w1 = tl.load(row + 1).to(tl.uint32, bitcast=True)
        w2 = tl.load(row + 2).to(tl.uint32, bitcast=True)
        # the group's activations as one flat vector, summed there (the minimum's term): Triton 3.6 then
        # converts them where they load, not in each thread that reads them back
        x_flat = _x(x_ptr, k0 + tl.arange(0, GROUP_SIZE), K, EVEN_K, columns_ptr, HAS_COLUMNS)
        group_sum = tl.sum(x_flat, axis=0)
        x16 = tl.reshape(x_flat, [CHUNKS, 16])
        # column k = 8a + 4b + 2d + e of the chunk: split from the last axis of [CHUNKS, a, b, d, e]
        ev, od = tl.split(tl.reshape(x16, [CHUNKS, 2, 2, 2, 2]))  # e = 0 / 1: the even / odd columns
        ev0, ev1 = tl.split(ev)
        od0, od1 = tl.split(od)
        ev00, ev01 = tl.split(ev0)
        ev10, ev11 = tl.split(ev1)
        od00, od01 = tl.split(od0)
        od10, od11 = tl.split(od1)
        x0, x8 = tl.split(ev00)
        x4, x12 = tl.split(ev01)
        x2, x10 = tl.split(ev10)
        x6, x14 = tl.split(ev11)
        x1, x9 = tl.split(od00)
        x5, x13 = tl.split(od01)
        x3, x11 = tl.split(od10)
        x7, x15 = tl.split(od11)
        even = ((x0 + x2) + (x4 + x6)) + ((x8 + x10) + (x12 + x14))  # [CHUNKS]
        odd = ((x1 + x3) + (x5 + x7)) + ((x9 + x11) + (x13 + x15))
        s = tl.fma(even, -4096.0, odd * -64.0)[None, :]  # [1, CHUNKS]
        # codes 2m, 2m + 1 sit at bits 12m, 12m + 6 of the 96: the 32 bits from 12m - 11 put them at 11, 17
        s = _pair(s, w0 << 11, x0, x1, m11, m17)
        s = _pair(s, w0 >> 1, x2, x3, m11, m17)
        s = _pair(s, (w0 >> 13) | (w1 << 19), x4, x5, m11, m17)
        s = _pair(s, w1 << 7, x6, x7, m11, m17)
        s = _pair(s, w1 >> 5, x8, x9, m11, m17)
        s = _pair(s, (w1 >> 17) | (w2 << 15), x10, x11, m11, m17)
        s = _pair(s, w2 << 3, x12, x13, m11, m17)
        s = _pair(s, w2 >> 9, x14, x15, m11, m17)
        scale = _group_column(scales_ptr, rows_in, num_groups, group)
        minimum = _group_column(mins_ptr, rows_in, num_groups, group)
        total = tl.fma(s, scale[:, None], total)
        row_total = tl.fma(minimum, group_sum, row_total)  # min sum_k x_k: once a row
    _store_rows(total, row_total, offs_n, n_mask, out_ptr, sums_ptr, arrivals_ptr, SPLIT_K)
