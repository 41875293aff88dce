"""The 4-bit GEMV at M = 1 on the CUDA cores: no tensor-core tile, so no 16-row padding and no trip of the
unpacked weight through shared memory into an operand layout.

Each program takes BLOCK_N weight rows and a slice of K, in groups; each thread keeps its rows' int32 words
(eight codes, columns 8t..8t+7) in registers as loaded. A code c at nibble e <= 4 of a word becomes a float
without an int-to-float instruction: OR-ed into the mantissa of 2^23 (masked in place, not shifted down) it
reads as 2^23 + c 16^e exactly, and one subtraction leaves c 16^e; the activation it meets is pre-scaled by
16^-e (exact: a power of two), so

    sum_k x_k c_k = sum_e (x_e 16^-e) (float(c_e 16^e | 2^23) - 2^23)

costs an AND, a subtraction and an FMA per code, the exponent bits OR-ed in once a word; nibbles 5..7
take one shift per word first (down 12 bits: to positions 2..4). The per-word sums s then take the group's
scale and minimum as two FMAs a word, sum_k x_k (c_k scale + min) = scale s + min sum_k x_k, into an fp32
[BLOCK_N, words] total that is summed across the words (and threads) once, at the end. Split-K as the
tensor-core GEMV does (split_k.py's split_k_store): partial sums added into a zeroed fp32 buffer, the
tile's last slice stores.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ninfer_kernels.quant_matmul.split_k import split_k_store

# the bits of 2^23 (its mantissa's unit is 1), passed as an argument: as a compile-time constant the
# compiler folds the OR into each code's AND as a second constant, which then costs a register move a code
MAGIC = 0x4B000000
MAGIC_VALUE = tl.constexpr(8388608.0)


@triton.jit
def _nibble_dot(s, src, x_ptr, kk, K, E: tl.constexpr, X_SCALE: tl.constexpr, EVEN_K: tl.constexpr):
    """s + the codes at nibble E (<= 4) of the words src [BLOCK_N, WORDS] (2^23's exponent bits OR-ed in)
    times x[kk] [WORDS] (X_SCALE = 16^-E), fp32; EVEN_K: K is whole groups (no mask on x)."""
    MASK: tl.constexpr = (15 << (4 * E)) | 0x4B000000  # the nibble and MAGIC's bits
    if EVEN_K:
        x = tl.load(x_ptr + kk).to(tl.float32)  # [WORDS]
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    code = (src & MASK).to(tl.float32, bitcast=True) - MAGIC_VALUE  # c 16^E, exact
    return tl.fma(code, (x * X_SCALE)[None, :], s), x


@triton.jit(do_not_specialize=["magic"])
def gemv4_cuda_cores_kernel(
    x_ptr,  # [1, K]
    packed_ptr,  # int32 [N, KP / 8]: eight 4-bit codes a word
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G]
    out_ptr,  # [1, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per tile, zero before and after
    N,
    K,
    KP,
    num_groups,
    GROUPS_PER_SPLIT,
    magic,  # MAGIC
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of GROUP_SIZE
    STAGES: tl.constexpr,
):
    WORDS: tl.constexpr = GROUP_SIZE // 8
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    t = tl.arange(0, WORDS)
    k_start = tl.program_id(2) * GROUPS_PER_SPLIT * GROUP_SIZE
    k_end = tl.minimum(K, k_start + GROUPS_PER_SPLIT * GROUP_SIZE)
    total = tl.zeros([BLOCK_N, WORDS], tl.float32)
    # STAGES > 1: the word tiles of the next STAGES - 1 groups copied asynchronously into shared memory
    # while one is computed (cp.async); 1: each group's loads wait in its own step
    for k0 in tl.range(k_start, k_end, GROUP_SIZE, num_stages=STAGES):
        group = k0 // GROUP_SIZE
        word = tl.load(
            packed_ptr + offs_n[:, None] * (KP // 8) + (k0 // 8 + t)[None, :], mask=n_mask[:, None], other=0
        )  # [BLOCK_N, WORDS]
        # the exponent bits of 2^23 OR-ed in once a word (above the nibbles read, 0..4), so that one AND a
        # code with a single constant leaves 2^23 + c 16^e; nibbles 5, 6, 7 shifted to positions 2, 3, 4
        high = (word >> 12) | magic
        word = word | magic
        kk = k0 + t * 8  # [WORDS]: each word's first column
        s = tl.zeros([BLOCK_N, WORDS], tl.float32)
        s, x0 = _nibble_dot(s, word, x_ptr, kk, K, 0, 1.0, EVEN_K)
        s, x1 = _nibble_dot(s, word, x_ptr, kk + 1, K, 1, 0.0625, EVEN_K)
        s, x2 = _nibble_dot(s, word, x_ptr, kk + 2, K, 2, 0.00390625, EVEN_K)
        s, x3 = _nibble_dot(s, word, x_ptr, kk + 3, K, 3, 0.000244140625, EVEN_K)
        s, x4 = _nibble_dot(s, word, x_ptr, kk + 4, K, 4, 1.52587890625e-05, EVEN_K)
        s, x5 = _nibble_dot(s, high, x_ptr, kk + 5, K, 2, 0.00390625, EVEN_K)
        s, x6 = _nibble_dot(s, high, x_ptr, kk + 6, K, 3, 0.000244140625, EVEN_K)
        s, x7 = _nibble_dot(s, high, x_ptr, kk + 7, K, 4, 1.52587890625e-05, EVEN_K)
        scale = tl.load(scales_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
        total = tl.fma(s, scale[:, None], total)
        if HAS_MINS:
            minimum = tl.load(mins_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
            xsum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))  # [WORDS]: each word's activations
            total = tl.fma(xsum[None, :], minimum[:, None], total)
    acc = tl.sum(total, axis=1)[None, :]  # [1, BLOCK_N]
    mask = n_mask[None, :]
    dst, sums = out_ptr + offs_n[None, :], sums_ptr + offs_n[None, :]
    split_k_store(acc, mask, dst, sums, arrivals_ptr, tl.program_id(1), SPLIT_K)
