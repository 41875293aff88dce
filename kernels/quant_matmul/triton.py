"""W4A16 / W8A16 matmul with the dequantization fused into the loads.

Weights stay packed in memory (engine/quant/groupwise.py's layout: groups of GROUP_SIZE input columns,
4-bit codes two per byte with the even column in the low nibble, w = q * scale + minimum; 6-bit codes four
per little-endian 24-bit word (3 bytes), first code in the low bits, w = q * scale + minimum; 8-bit signed
codes, w = q * scale). The 4-bit product runs as x_even @ W_even^T + x_odd @ W_odd^T and the 6-bit one as
four products over the columns 4i + p, so unpacked codes never need interleaving.

* prefill shapes (M > 8): a tiled GEMM, one program per [BLOCK_M, BLOCK_N] output tile, K in
  group-sized steps (one scale per row of the weight tile per step);
* decode shapes (M <= 8): split-K GEMV, each program takes a slice of K for BLOCK_N outputs and adds its
  partial sums into an fp32 buffer, so a single row still spreads over many programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_matmul import MIN_GROUP
from kernels.triton_config import dot_precision


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
):
    """x[offs_m, k0:k0+GROUP_SIZE] @ W[offs_n, k0:k0+GROUP_SIZE]^T as [BLOCK_M, BLOCK_N] fp32."""
    m_mask = offs_m < M
    n_mask = offs_n < N
    group = k0 // GROUP_SIZE
    scale = tl.load(scales_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    if HAS_MINS:
        minimum = tl.load(mins_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    if BITS == 4:
        HALF: tl.constexpr = GROUP_SIZE // 2
        j = tl.arange(0, HALF)
        even_k = k0 + 2 * j
        x_even = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + even_k[None, :],
            mask=m_mask[:, None] & (even_k[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        x_odd = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + even_k[None, :] + 1,
            mask=m_mask[:, None] & (even_k[None, :] + 1 < K),
            other=0.0,
        ).to(tl.float32)
        byte = tl.load(
            packed_ptr + offs_n[:, None] * (KP // 2) + (k0 // 2 + j)[None, :], mask=n_mask[:, None], other=0
        ).to(tl.int32)
        w_even = (byte & 15).to(tl.float32) * scale[:, None]
        w_odd = (byte >> 4).to(tl.float32) * scale[:, None]
        if HAS_MINS:
            w_even += minimum[:, None]
            w_odd += minimum[:, None]
        acc = tl.dot(x_even, tl.trans(w_even), input_precision=PRECISION)
        acc += tl.dot(x_odd, tl.trans(w_odd), input_precision=PRECISION)
    elif BITS == 6:
        QUARTER: tl.constexpr = GROUP_SIZE // 4
        j = tl.arange(0, QUARTER)
        row = packed_ptr + offs_n[:, None] * (KP // 4 * 3) + (k0 // 4 + j)[None, :] * 3
        word = tl.load(row, mask=n_mask[:, None], other=0).to(tl.int32)
        word |= tl.load(row + 1, mask=n_mask[:, None], other=0).to(tl.int32) << 8
        word |= tl.load(row + 2, mask=n_mask[:, None], other=0).to(tl.int32) << 16
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for p in tl.static_range(4):
            cols = k0 + 4 * j + p
            x = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + cols[None, :],
                mask=m_mask[:, None] & (cols[None, :] < K),
                other=0.0,
            ).to(tl.float32)
            w = ((word >> (6 * p)) & 63).to(tl.float32) * scale[:, None]
            if HAS_MINS:
                w += minimum[:, None]
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    else:
        kk = k0 + tl.arange(0, GROUP_SIZE)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :],
            mask=m_mask[:, None] & (kk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        q = tl.load(packed_ptr + offs_n[:, None] * KP + kk[None, :], mask=n_mask[:, None], other=0)
        w = q.to(tl.float32) * scale[:, None]
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
        )
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K:
        tl.atomic_add(dst, acc, mask=mask)
    else:
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)


GEMV_MAX_M = 8


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
    )
    mins = minimums if minimums is not None else scales
    groups = triton.cdiv(k, group_size)
    if m <= GEMV_MAX_M:  # split-K GEMV: enough K slices that small-N matrices still fill the GPU
        out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        block_m = 16
        splits = num_splits or max(1, min(groups, 256 // triton.cdiv(n, block_n)))
        per_split = triton.cdiv(groups, splits)
    else:  # tiled GEMM, K whole in every program
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        block_m, per_split = 32, groups
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), triton.cdiv(groups, per_split))
    _quant_matmul_kernel[grid](
        x,
        packed,
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
