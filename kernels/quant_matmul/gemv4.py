"""The 4-bit GEMV at M = 1 on the CUDA cores: no tensor-core tile, so no 16-row padding and no trip of the
unpacked weight through shared memory into an operand layout.

Each program takes BLOCK_N weight rows and a slice of K, in groups; each thread keeps its rows' int32 words
(eight codes, columns 8t..8t+7) in registers as loaded. A code c becomes a float without an int-to-float
instruction: masked in place at bit P of a word and OR-ed with the exponent bits of 2^(23 - P), it reads
as 2^(23 - P) + c exactly (the mantissa's unit is then 1 at bit P). Every nibble is brought to bit 12 or
16 (nibbles 3, 4 are there; 1, 2 one shift up, 5, 6 one shift down, 7 and 0 one rotation: three a word),
and the offsets are paid once a word, not once a code, by starting each word's sum at minus them:

    sum_e x_e c_e = sum_e x_e float(c_e << P_e | 2^(23 - P_e)) - (2^11 sum_odd x_e + 2^7 sum_even x_e)

so a code costs one AND-OR (a LOP3) and one FMA. The offsets cost precision, not instructions: the sum
carries ~2^11 |x| where the products carry ~8 |x|, leaving ~16 of fp32's 24 bits (3e-5 relative, measured;
bf16 / fp16 outputs keep 8 / 11). The per-word sums s then take the group's scale as an FMA a word into
an fp32 [BLOCK_N, words] total, sum_k x_k (c_k scale + min) = scale s + min sum_k x_k, and the minimum once
a row a group (min times the group's activation sum: one reduction a step, shared by the rows; groups of
32, where that reduction costs more than it saves, an FMA a word); the total is summed across the words
(and threads) once, at the end. Split-K as the tensor-core GEMV does (split_k.py's
split_k_store): partial sums added into a zeroed fp32 buffer, the tile's last slice stores.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.split_k import split_k_store

# the exponent bits of 2^11 and 2^7: OR-ed above a code masked in place at bit 12 or 16 of a word, they
# make the float 2^11 + c or 2^7 + c exactly. Passed as arguments: as compile-time constants the compiler
# folds them into each code's AND as a second constant, which then costs a register move a code
MAGIC_12 = 0x45000000
MAGIC_16 = 0x43000000


@triton.jit
def _code(src, P: tl.constexpr, magic):
    """The codes at bits P..P+3 of the words src (uint32) as floats 2^(23 - P) + c: one AND-OR each."""
    return ((src & (15 << P)) | magic).to(tl.float32, bitcast=True)


@triton.jit
def _x(x_ptr, kk, K, EVEN_K: tl.constexpr, columns_ptr, HAS_COLUMNS: tl.constexpr):
    """x[kk] in fp32 (EVEN_K: K is whole groups, no mask); HAS_COLUMNS (an act-order weight): x[columns[kk]],
    the input column each stored column holds (int32 [K] at columns_ptr), gathered as it loads."""
    if EVEN_K:
        if HAS_COLUMNS:
            kk = tl.load(columns_ptr + kk)
        return tl.load(x_ptr + kk).to(tl.float32)
    inside = kk < K
    if HAS_COLUMNS:
        kk = tl.load(columns_ptr + kk, mask=inside, other=0)
    return tl.load(x_ptr + kk, mask=inside, other=0.0).to(tl.float32)


@triton.jit
def _word_columns(x8, WORDS: tl.constexpr):
    """The eight columns of x8 ([WORDS, 8]: each word's activations), [WORDS] each, split in registers."""
    return split_eight(tl.reshape(x8, [WORDS, 2, 2, 2]))


@triton.jit
def split_eight(x):
    """x [..., 2, 2, 2], column 4a + 2b + c of each word at [..., a, b, c], split into its columns 0..7 (each
    [...], in registers: three levels of splits)."""
    even4, odd4 = tl.split(x)  # columns 0, 2, 4, 6 and 1, 3, 5, 7
    e04, e26 = tl.split(even4)
    o15, o37 = tl.split(odd4)
    x0, x4 = tl.split(e04)
    x2, x6 = tl.split(e26)
    x1, x5 = tl.split(o15)
    x3, x7 = tl.split(o37)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _rows_and_slice(N, K, GROUPS_PER_SPLIT, GROUP_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's weight rows (offs_n [BLOCK_N] and their mask), the rows it reads (offs_n, the last
    row again past N: read, never stored, so no load of a step needs a mask) and its K slice
    [k_start, k_end)."""
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * GROUPS_PER_SPLIT * GROUP_SIZE
    k_end = tl.minimum(K, k_start + GROUPS_PER_SPLIT * GROUP_SIZE)
    return offs_n, offs_n < N, tl.minimum(offs_n, N - 1), k_start, k_end


@triton.jit
def _group_column(ptr, rows, num_groups, group):
    """A group's fp16 scale or minimum of each row ([N, G] at ptr) in fp32 ([BLOCK_N])."""
    return tl.load(ptr + rows * num_groups + group).to(tl.float32)


@triton.jit
def _store_rows(total, row_total, offs_n, n_mask, out_ptr, sums_ptr, arrivals_ptr, SPLIT_K: tl.constexpr):
    """Each row's total (total [BLOCK_N, words] summed across its words, plus row_total [BLOCK_N] or 0)
    stored at out_ptr ([1, N]), or added at sums_ptr over the K slices (split_k.py)."""
    acc = (tl.sum(total, axis=1) + row_total)[None, :]  # [1, BLOCK_N]
    dst, sums = out_ptr + offs_n[None, :], sums_ptr + offs_n[None, :]
    split_k_store(acc, n_mask[None, :], dst, sums, arrivals_ptr, tl.program_id(1), SPLIT_K)


@triton.jit(do_not_specialize=["magic_12", "magic_16"])
def gemv4_cuda_cores_kernel(
    x_ptr,  # [1, K]
    packed_ptr,  # int32 [N, row_words]: eight 4-bit codes a word
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G]
    out_ptr,  # [1, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    columns_ptr,  # HAS_COLUMNS: int32 [K], the input column each stored column holds (act-order)
    N,
    K,
    row_words,  # KP / 8 (an argument of its own: a multiple of 16 lets the words load 16 bytes at a time)
    num_groups,
    GROUPS_PER_SPLIT,
    magic_12,  # MAGIC_12
    magic_16,  # MAGIC_16
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of GROUP_SIZE
    STAGES: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
    PREFETCH: tl.constexpr = False,  # the next group's words loaded into registers before this one's sums
):
    WORDS: tl.constexpr = GROUP_SIZE // 8
    offs_n, n_mask, rows_in, k_start, k_end = _rows_and_slice(N, K, GROUPS_PER_SPLIT, GROUP_SIZE, BLOCK_N)
    t = tl.arange(0, WORDS)
    m12 = magic_12.to(tl.uint32, bitcast=True)
    m16 = magic_16.to(tl.uint32, bitcast=True)
    total = tl.zeros([BLOCK_N, WORDS], tl.float32)
    row_total = tl.zeros([BLOCK_N], tl.float32)
    # STAGES > 1: the word tiles of the next STAGES - 1 groups copied asynchronously into shared memory
    # while one is computed (cp.async); 1: each group's loads wait in its own step
    rows = packed_ptr + rows_in[:, None] * row_words + t[None, :]  # [BLOCK_N, WORDS]: a group's words at k 0
    if PREFETCH:  # (the bounds as [WORDS] vectors: the interpreter refuses a mask AND-ed with a scalar)
        ahead = tl.load(rows + k_start // 8, mask=(k_start + 0 * t < k_end)[None, :], other=0)
    for k0 in tl.range(k_start, k_end, GROUP_SIZE, num_stages=STAGES):
        group = k0 // GROUP_SIZE
        if PREFETCH:  # this group's words came a step ago; the next group's leave now, one step to arrive
            word = ahead.to(tl.uint32, bitcast=True)
            next_k = k0 + GROUP_SIZE
            ahead = tl.load(rows + next_k // 8, mask=(next_k + 0 * t < k_end)[None, :], other=0)
        else:
            word = tl.load(rows + k0 // 8).to(tl.uint32, bitcast=True)
        # every nibble moved to bit 12 or 16 (where 2^11 or 2^7 makes its unit 1): nibbles 3, 4 are there;
        # 1, 2 a shift up by 8; 5, 6 down by 8; 7 and 0 a rotation by 16
        up, down, rot = word << 8, word >> 8, (word << 16) | (word >> 16)
        # the group's activations as one flat vector, summed there (the minimum's term): Triton 3.6 then
        # converts them where they load, not in each thread that reads them back
        x_flat = _x(x_ptr, k0 + tl.arange(0, GROUP_SIZE), K, EVEN_K, columns_ptr, HAS_COLUMNS)
        group_sum = tl.sum(x_flat, axis=0)
        x8 = tl.reshape(x_flat, [WORDS, 8])
        x0, x1, x2, x3, x4, x5, x6, x7 = _word_columns(x8, WORDS)
        # sum_e x_e (2^E_e + c_e) counts each activation 2^E_e times over: start each word's sum below zero
        # by that much (2^11 for the odd nibbles, at bit 12; 2^7 for the even ones, at 16)
        odd, even = (x1 + x3) + (x5 + x7), (x0 + x2) + (x4 + x6)  # [WORDS]
        s = tl.fma(odd, -2048.0, even * -128.0)[None, :]  # [1, WORDS]
        s = tl.fma(_code(rot, 16, m16), x0[None, :], s)  # [BLOCK_N, WORDS]
        s = tl.fma(_code(up, 12, m12), x1[None, :], s)
        s = tl.fma(_code(up, 16, m16), x2[None, :], s)
        s = tl.fma(_code(word, 12, m12), x3[None, :], s)
        s = tl.fma(_code(word, 16, m16), x4[None, :], s)
        s = tl.fma(_code(down, 12, m12), x5[None, :], s)
        s = tl.fma(_code(down, 16, m16), x6[None, :], s)
        s = tl.fma(_code(rot, 12, m12), x7[None, :], s)
        scale = _group_column(scales_ptr, rows_in, num_groups, group)
        total = tl.fma(s, scale[:, None], total)
        if HAS_MINS:  # min sum_k x_k over the group: once a row (groups of 32: once a word, no reduction)
            minimum = _group_column(mins_ptr, rows_in, num_groups, group)
            if WORDS >= 16:
                row_total = tl.fma(minimum, group_sum, row_total)
            else:
                total = tl.fma((odd + even)[None, :], minimum[:, None], total)
    _store_rows(total, row_total, offs_n, n_mask, out_ptr, sums_ptr, arrivals_ptr, SPLIT_K)
