"""The 8-bit GEMV at M = 1 on the CUDA cores, in the way of gemv4.py.

A row's signed codes come four to an int32 word (column 4t + b at byte b). One XOR a word makes them
offset-binary (u = c + 128); a shift up by 7 brings bytes 0 and 1 to bits 7 and 15, a shift down by 9
bytes 2 and 3. Masked in place and OR-ed with the exponent bits of 2^16 or 2^8 they read as 2^16 + u and
2^8 + u exactly, and each word's sum starts at minus the offsets:

    sum_b x_b c_b = sum_b x_b float(u_b << P_b | 2^(23 - P_b)) - ((2^16 + 128) (x_0 + x_2) + (2^8 + 128) (x_1 + x_3))

Per code one AND-OR and one FMA, per two codes one shift, per word one XOR; the group's scale (symmetric:
no minimum) as one FMA a word into an fp32 [BLOCK_N, words] total, summed once at the end; split-K
through split_k.py. The 2^16 offset leaves ~14 of the fp32 sum's 24 bits for the products.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.gemv4 import _group_column, _rows_and_slice, _store_rows, _x

# the exponent bits of 2^16 and 2^8 (codes at bits 7 and 15), passed as arguments as gemv4.py's are
MAGIC_7 = 0x47800000
MAGIC_15 = 0x43800000
SIGN_BITS = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as an int32: each byte's sign bit


@triton.jit
def _code8(src, P: tl.constexpr, magic):
    """The bytes at bits P..P+7 of the words src (uint32) as floats 2^(23 - P) + u: one AND-OR each."""
    return ((src & (255 << P)) | magic).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["magic_7", "magic_15"])
def gemv8_cuda_cores_kernel(
    x_ptr,  # [1, K]
    packed_ptr,  # int32 [N, row_words]: four signed 8-bit codes a word
    scales_ptr,  # fp16 [N, G]
    out_ptr,  # [1, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    columns_ptr,  # HAS_COLUMNS: int32 [K], the input column each stored column holds (act-order)
    N,
    K,
    row_words,  # KP / 4
    num_groups,
    GROUPS_PER_SPLIT,
    magic_7,  # MAGIC_7
    magic_15,  # MAGIC_15
    GROUP_SIZE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of GROUP_SIZE
    STAGES: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
):
    WORDS: tl.constexpr = GROUP_SIZE // 4
    offs_n, n_mask, rows_in, k_start, k_end = _rows_and_slice(N, K, GROUPS_PER_SPLIT, GROUP_SIZE, BLOCK_N)
    t = tl.arange(0, WORDS)
    m7 = magic_7.to(tl.uint32, bitcast=True)
    m15 = magic_15.to(tl.uint32, bitcast=True)
    total = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for k0 in tl.range(k_start, k_end, GROUP_SIZE, num_stages=STAGES):
        group = k0 // GROUP_SIZE
        word = tl.load(packed_ptr + rows_in[:, None] * row_words + (k0 // 4 + t)[None, :])  # [BLOCK_N, WORDS]
        u = (word ^ SIGN_BITS).to(tl.uint32, bitcast=True)  # each byte c + 128
        low, high = u << 7, u >> 9  # bytes 0, 1 at bits 7, 15; bytes 2, 3 there
        kk = (k0 + 4 * t)[:, None] + tl.arange(0, 4)[None, :]
        x4 = _x(x_ptr, kk, K, EVEN_K, columns_ptr, HAS_COLUMNS)  # [WORDS, 4]
        even, odd = tl.split(tl.reshape(x4, [WORDS, 2, 2]))  # bytes 0, 2 and 1, 3
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        s = tl.fma(x0 + x2, -65664.0, (x1 + x3) * -384.0)[None, :]  # [1, WORDS]: 2^16 + 128, 2^8 + 128
        s = tl.fma(_code8(low, 7, m7), x0[None, :], s)  # [BLOCK_N, WORDS]
        s = tl.fma(_code8(low, 15, m15), x1[None, :], s)
        s = tl.fma(_code8(high, 7, m7), x2[None, :], s)
        s = tl.fma(_code8(high, 15, m15), x3[None, :], s)
        scale = _group_column(scales_ptr, rows_in, num_groups, group)
        total = tl.fma(s, scale[:, None], total)
    _store_rows(total, 0.0, offs_n, n_mask, out_ptr, sums_ptr, arrivals_ptr, SPLIT_K)  # (no minimums)
