"""Group-wise quantized weights times int8 activations on the int8 tensor cores (prefill shapes).

The weight stays packed (kernels/quant_matmul's layouts: w = q * scale + minimum for 4 / 6-bit codes q >= 0,
w = q * scale for signed 8-bit ones) and x arrives quantized per (row, group) by kernels/int8_act: x = c *
s_x. Every code fits an int8, so per group g one integer product covers the group exactly,

    sum_k x_k w_k = s_x * (scale * sum_k c_k q_k + minimum * sum_k c_k)

with sum_k c_k q_k from tl.dot (int8 x int8 -> int32; |sum| <= 127 * 127 * 128, exact in fp32 too) and
sum_k c_k the activation code sums kernels/int8_act wrote. One program per [BLOCK_M, BLOCK_N] output tile
steps over K a group at a time: unpack the weight tile's codes to int8 in natural column order (4-bit: the
low and high nibble of each byte joined; 6-bit: the four codes of each 24-bit word), one integer product,
then three FMAs an output into the fp32 total. Output tiles run in bands of GROUP_M row tiles so that
neighbouring programs share weight tiles in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.int8_matmul import MIN_GROUP
from ninfer_kernels.triton_codes import unpack_codes


@triton.jit
def _int8_matmul_kernel(
    codes_ptr,  # int8 [M, KP]
    x_scales_ptr,  # fp32 [M, G]
    x_sums_ptr,  # int32 [M, G]
    packed_ptr,
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G] (HAS_MINS)
    out_ptr,  # [M, N]
    M,
    N,
    KP,
    stride_om,
    num_groups,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # program id -> output tile, GROUP_M row tiles a band, the band's tiles column by column
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    band = pid // (GROUP_M * tiles_n)
    first_m = band * GROUP_M
    rows_in_band = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % (GROUP_M * tiles_n)) % rows_in_band
    tile_n = (pid % (GROUP_M * tiles_n)) // rows_in_band
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    kk = tl.arange(0, GROUP_SIZE)
    total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for g in range(0, num_groups):
        k0 = g * GROUP_SIZE
        a = tl.load(codes_ptr + offs_m[:, None] * KP + (k0 + kk)[None, :], mask=m_mask[:, None], other=0)
        w = unpack_codes(packed_ptr, offs_n, n_mask, k0, KP, BITS, BLOCK_N, GROUP_SIZE).to(tl.int8)
        prod = tl.dot(a, tl.trans(w), out_dtype=tl.int32).to(tl.float32)  # [BLOCK_M, BLOCK_N]
        scale = tl.load(scales_ptr + offs_n * num_groups + g, mask=n_mask, other=0.0).to(tl.float32)
        x_scale = tl.load(x_scales_ptr + offs_m * num_groups + g, mask=m_mask, other=0.0)
        part = prod * scale[None, :]
        if HAS_MINS:
            minimum = tl.load(mins_ptr + offs_n * num_groups + g, mask=n_mask, other=0.0).to(tl.float32)
            x_sum = tl.load(x_sums_ptr + offs_m * num_groups + g, mask=m_mask, other=0).to(tl.float32)
            part = tl.fma(x_sum[:, None], minimum[None, :], part)
        total = tl.fma(part, x_scale[:, None], total)
    mask = m_mask[:, None] & n_mask[None, :]
    dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(dst, total.to(out_ptr.dtype.element_ty), mask=mask)


def int8_matmul(
    codes: torch.Tensor,
    x_scales: torch.Tensor,
    x_sums: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    out: torch.Tensor,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    group_m: int = 8,
    num_warps: int = 8,
    num_stages: int = 3,
) -> torch.Tensor:
    """See kernels/int8_matmul/naive.py. block_m (default 64 up to 64 rows of x, else 128), block_n,
    group_m (row tiles a band), num_warps and num_stages are knobs for benchmarks/gpu_kernels.py's sweeps.
    The defaults are the tiles that compile without spills on SM 8.6 and 9.0 with the fewest inner-loop
    instructions (scripts/cuda_compile_check.py --sass; 128 x 128 tiles spill: the unpacked weight tile,
    the integer product and the fp32 total all live in registers)."""
    assert bits in (4, 6, 8) and packed.is_contiguous() and codes.is_contiguous()
    assert group_size >= MIN_GROUP, f"groups of {group_size}: the int8 kernel needs {MIN_GROUP}+"
    m, kp = codes.shape
    n, num_groups = scales.shape
    assert kp == num_groups * group_size and x_scales.shape == x_sums.shape == (m, num_groups)
    assert out.shape == (m, n) and out.stride(1) == 1
    block_m = block_m or (64 if m <= 64 else 128)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _int8_matmul_kernel[grid](
        codes,
        x_scales,
        x_sums,
        packed.view(torch.int32) if bits == 6 else packed,
        scales,
        minimums if minimums is not None else scales,
        out,
        m,
        n,
        kp,
        out.stride(0),
        num_groups,
        BITS=bits,
        GROUP_SIZE=group_size,
        HAS_MINS=minimums is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        GROUP_M=group_m,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
