"""W4A16 / W6A16 / W8A16 matmul with the dequantization fused into the loads.

Weights stay packed in memory (engine/quant/groupwise.py's layout: groups of GROUP_SIZE input columns,
4-bit codes two per byte with the even column in the low nibble, w = q * scale + minimum; 6-bit codes four
per little-endian 24-bit word (3 bytes), first code in the low bits, w = q * scale + minimum; 8-bit signed
codes, w = q * scale). The products run on the model's half dtype (fp32 under the interpreter) with fp32
accumulation. Each width is split into products whose k index needs no interleaving of unpacked codes:

* 4-bit, groups of 64+: the row is read as int32 words of eight codes. Product p takes codes p and p + 4
  of every word in one shift and mask (they land in the two 16-bit halves), and one OR with a magic
  number makes both halves the half-precision floats 1024 + q (fp16) or 128 + q (bf16), so the
  conversion is integer bit operations plus one packed subtraction, no int-to-float instruction. The
  activations are loaded once per group and split into the four products' columns in registers.
* 4-bit, groups of 32: x_even @ W_even^T + x_odd @ W_odd^T over the bytes;
* 6-bit: four products over the columns 4i + p; 8-bit: one product.

Shapes:
* prefill (M > 8): a tiled GEMM, one program per [BLOCK_M, BLOCK_N] output tile, K in group-sized steps
  (one scale per row of the weight tile per step);
* decode (M <= 8): split-K GEMV, each program takes a slice of K for BLOCK_N outputs and adds its partial
  sums into an fp32 buffer; the slices are sized so every SM gets several programs (gemv_splits).

scripts/cuda_compile_check.py --sass counts the instructions of the compiled inner loop per KB of packed
weight, which bounds the fraction of HBM bandwidth an SM can keep up with (docs/kernels.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.quant_matmul import MIN_GROUP
from kernels.triton_config import dot_dtype, dot_precision


@triton.jit
def _small_codes_to_float(q, DTYPE: tl.constexpr):
    """Non-negative integer codes below 256 (fp32: 2^23) to DTYPE exactly, by bits rather than a conversion
    instruction: the code is OR-ed into the mantissa of a power of two, which is then subtracted."""
    if DTYPE == tl.float16:
        return (q.to(tl.int16) | 0x6400).to(tl.float16, bitcast=True) - 1024.0
    elif DTYPE == tl.bfloat16:
        return (q.to(tl.int16) | 0x4300).to(tl.bfloat16, bitcast=True) - 128.0
    else:
        return (q.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _code_pairs_to_float(pairs, DTYPE: tl.constexpr):
    """int32 words holding a code below 16 in each 16-bit half -> DTYPE [..., 2], high half first. For half
    types one OR turns both halves into the magic-number floats of _small_codes_to_float, and the
    subtraction runs on the pair (the joined halves share a register)."""
    if DTYPE == tl.float16:
        bits = pairs | 0x64006400
        hi = (bits >> 16).to(tl.int16).to(tl.float16, bitcast=True)
        return tl.join(hi, (bits & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)) - 1024.0
    elif DTYPE == tl.bfloat16:
        bits = pairs | 0x43004300
        hi = (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        return tl.join(hi, (bits & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)) - 128.0
    else:
        return tl.join((pairs >> 16).to(DTYPE), (pairs & 0xFFFF).to(DTYPE))


@triton.jit
def _nibble_product(
    x,  # [BLOCK_M, EIGHTH, 2]: the columns 8t + p (h = 0) and 8t + 4 + p (h = 1)
    word,  # [BLOCK_N, EIGHTH] int32: eight codes a word, code i in bits 4i .. 4i + 3
    p: tl.constexpr,
    scale,  # [BLOCK_N, 1]
    minimum,  # [BLOCK_N, 1]
    HAS_MINS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EIGHTH: tl.constexpr,
    PRECISION: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """x @ W^T over codes p and p + 4 of every word: the 16-bit halves of (word >> 4p) & 0x000F000F, k index
    2t (code p + 4, the high half) and 2t + 1 (code p)."""
    w = tl.reshape(_code_pairs_to_float((word >> (4 * p)) & 0x000F000F, DTYPE), (BLOCK_N, 2 * EIGHTH)) * scale
    if HAS_MINS:
        w += minimum
    x_lo, x_hi = tl.split(x)
    x = tl.reshape(tl.join(x_hi, x_lo), (BLOCK_M, 2 * EIGHTH))
    return tl.dot(x, tl.trans(w), input_precision=PRECISION)


@triton.jit
def _tile_product(
    x_ptr,
    packed_ptr,
    scales_ptr,
    mins_ptr,
    offs_m,
    offs_n,
    k0,
    M,
    N,
    K,
    KP,
    stride_xm,
    num_groups,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """x[offs_m, k0:k0+GROUP_SIZE] @ W[offs_n, k0:k0+GROUP_SIZE]^T as [BLOCK_M, BLOCK_N] fp32."""
    m_mask = offs_m < M
    n_mask = offs_n < N
    group = k0 // GROUP_SIZE
    scale = tl.load(scales_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    if HAS_MINS:
        minimum = tl.load(mins_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    if BITS == 4 and GROUP_SIZE >= 64:  # the packed row read as int32 words of eight codes (columns 8t..8t+7)
        EIGHTH: tl.constexpr = GROUP_SIZE // 8
        t = tl.arange(0, EIGHTH)
        word = tl.load(
            packed_ptr + offs_n[:, None] * (KP // 8) + (k0 // 8 + t)[None, :], mask=n_mask[:, None], other=0
        )
        s = scale.to(DOT_DTYPE)[:, None]
        z = minimum.to(DOT_DTYPE)[:, None] if HAS_MINS else s
        kk = k0 + tl.arange(0, GROUP_SIZE)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :],
            mask=m_mask[:, None] & (kk[None, :] < K),
            other=0.0,
        ).to(DOT_DTYPE)
        # column 8t + 4h + 2 p1 + p0 as [m, t, h, p1, p0], split into the four products p = 2 p1 + p0
        x_p0, x_p1 = tl.split(tl.reshape(x, (BLOCK_M, EIGHTH, 2, 2, 2)))
        x0, x2 = tl.split(x_p0)
        x1, x3 = tl.split(x_p1)
        acc = _nibble_product(x0, word, 0, s, z, HAS_MINS, BLOCK_M, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        acc += _nibble_product(x1, word, 1, s, z, HAS_MINS, BLOCK_M, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        acc += _nibble_product(x2, word, 2, s, z, HAS_MINS, BLOCK_M, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        acc += _nibble_product(x3, word, 3, s, z, HAS_MINS, BLOCK_M, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
    elif BITS == 4:
        HALF: tl.constexpr = GROUP_SIZE // 2
        j = tl.arange(0, HALF)
        even_k = k0 + 2 * j
        x_even = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + even_k[None, :],
            mask=m_mask[:, None] & (even_k[None, :] < K),
            other=0.0,
        ).to(DOT_DTYPE)
        x_odd = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + even_k[None, :] + 1,
            mask=m_mask[:, None] & (even_k[None, :] + 1 < K),
            other=0.0,
        ).to(DOT_DTYPE)
        byte = tl.load(
            packed_ptr + offs_n[:, None] * (KP // 2) + (k0 // 2 + j)[None, :], mask=n_mask[:, None], other=0
        )
        s = scale.to(DOT_DTYPE)[:, None]
        w_even = _small_codes_to_float(byte & 15, DOT_DTYPE) * s
        w_odd = _small_codes_to_float(byte >> 4, DOT_DTYPE) * s
        if HAS_MINS:
            w_even += minimum.to(DOT_DTYPE)[:, None]
            w_odd += minimum.to(DOT_DTYPE)[:, None]
        acc = tl.dot(x_even, tl.trans(w_even), input_precision=PRECISION)
        acc += tl.dot(x_odd, tl.trans(w_odd), input_precision=PRECISION)
    elif BITS == 6:
        QUARTER: tl.constexpr = GROUP_SIZE // 4
        j = tl.arange(0, QUARTER)
        row = packed_ptr + offs_n[:, None] * (KP // 4 * 3) + (k0 // 4 + j)[None, :] * 3
        word = tl.load(row, mask=n_mask[:, None], other=0).to(tl.int32)
        word |= tl.load(row + 1, mask=n_mask[:, None], other=0).to(tl.int32) << 8
        word |= tl.load(row + 2, mask=n_mask[:, None], other=0).to(tl.int32) << 16
        s = scale.to(DOT_DTYPE)[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for p in tl.static_range(4):
            cols = k0 + 4 * j + p
            x = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + cols[None, :],
                mask=m_mask[:, None] & (cols[None, :] < K),
                other=0.0,
            ).to(DOT_DTYPE)
            w = _small_codes_to_float((word >> (6 * p)) & 63, DOT_DTYPE) * s
            if HAS_MINS:
                w += minimum.to(DOT_DTYPE)[:, None]
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    else:
        kk = k0 + tl.arange(0, GROUP_SIZE)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :],
            mask=m_mask[:, None] & (kk[None, :] < K),
            other=0.0,
        ).to(DOT_DTYPE)
        q = tl.load(packed_ptr + offs_n[:, None] * KP + kk[None, :], mask=n_mask[:, None], other=0)
        w = q.to(DOT_DTYPE) * scale.to(DOT_DTYPE)[:, None]
        acc = tl.dot(x, tl.trans(w), input_precision=PRECISION)
    return acc


@triton.jit
def _quant_matmul_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    mins_ptr,
    out_ptr,  # [M, N]: x's dtype, or fp32 zeroed and accumulated into when SPLIT_K
    M,
    N,
    K,
    KP,
    stride_xm,
    stride_om,
    num_groups,
    GROUPS_PER_SPLIT,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * GROUPS_PER_SPLIT * GROUP_SIZE
    k_end = tl.minimum(K, k_start + GROUPS_PER_SPLIT * GROUP_SIZE)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, GROUP_SIZE):
        acc += _tile_product(
            x_ptr,
            packed_ptr,
            scales_ptr,
            mins_ptr,
            offs_m,
            offs_n,
            k0,
            M,
            N,
            K,
            KP,
            stride_xm,
            num_groups,
            BITS,
            GROUP_SIZE,
            HAS_MINS,
            BLOCK_M,
            BLOCK_N,
            PRECISION,
            DOT_DTYPE,
        )
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K:
        tl.atomic_add(dst, acc, mask=mask)
    else:
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)


GEMV_MAX_M = 8
GEMV_PROGRAMS_PER_SM = 8


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # an H100 / H200: what the compile check and the interpreter size the grid for
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemv_splits(n: int, groups: int, block_n: int, device: torch.device) -> int:
    """K slices of the split-K GEMV: about GEMV_PROGRAMS_PER_SM programs per SM, so every SM streams weights
    to the end. With one program per output tile, a 17408-row matrix in 64-row tiles is 272 programs: two
    on most of an H200's 132 SMs, three on a few, which then finish alone at a fraction of the bandwidth."""
    tiles = triton.cdiv(n, block_n)
    return max(1, min(groups, triton.cdiv(GEMV_PROGRAMS_PER_SM * _sm_count(device), tiles)))


def quant_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scales: torch.Tensor,  # fp16 [N, G]
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    *,
    block_n: int = 64,
    num_splits: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """See kernels/quant_matmul/naive.py. block_n, num_splits (GEMV: K slices; default enough to fill the
    GPU) and num_warps are tuning knobs for benchmarks/gpu_kernels.py's sweep."""
    assert bits in (4, 6, 8) and x.dim() == 2 and x.stride(1) == 1 and packed.is_contiguous()
    assert group_size >= MIN_GROUP[bits], (
        f"{bits}-bit groups of {group_size}: the kernel needs {MIN_GROUP[bits]}+"
    )
    m, k = x.shape
    n, num_groups = scales.shape
    kp = num_groups * group_size
    assert k <= kp, f"x has {k} columns, the weight {kp}"
    common = dict(
        BITS=bits,
        GROUP_SIZE=group_size,
        HAS_MINS=minimums is not None,
        PRECISION=dot_precision(x.dtype),
        DOT_DTYPE=dot_dtype(x.dtype),
    )
    mins = minimums if minimums is not None else scales
    groups = triton.cdiv(k, group_size)
    if m <= GEMV_MAX_M:  # split-K GEMV
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        block_m = 16
        splits = num_splits or gemv_splits(n, groups, block_n, x.device)
        per_split = triton.cdiv(groups, splits)
    else:  # tiled GEMM, K whole in every program
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        block_m, per_split = 32, groups
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), triton.cdiv(groups, per_split))
    _quant_matmul_kernel[grid](
        x,
        packed.view(torch.int32) if bits == 4 and group_size >= 64 else packed,
        scales,
        mins,
        out,
        m,
        n,
        k,
        kp,
        x.stride(0),
        out.stride(0),
        num_groups,
        per_split,
        SPLIT_K=m <= GEMV_MAX_M,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        **common,
    )
    return out.to(x.dtype)
