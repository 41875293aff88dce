"""Per-token, per-group int8 quantization of activations (see naive.py for the math): one program per row
and GROUPS groups of it; the codes, the scale and the code sum of each group in one pass over x."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.int8_act import QMAX


@triton.jit
def quantize_rows(x, QMAX: tl.constexpr):
    """x [R, C] fp32 -> (codes [R, C] fp32 holding integers in [-QMAX, QMAX], scales [R] fp32), each row as
    naive.quantize_act quantizes a group. Shared with the prefill attention's int8 queries."""
    amax = tl.max(tl.abs(x), axis=1)  # [R]
    inv = tl.where(amax > 0, QMAX / tl.where(amax > 0, amax, 1.0), 0.0)
    return tl.clamp(tl.floor(x * inv[:, None] + 0.5), -QMAX, QMAX), amax / QMAX


@triton.jit
def _quantize_act_kernel(
    x_ptr,
    codes_ptr,  # int8 [M, G * GROUP_SIZE]
    scales_ptr,  # fp32 [M, G]
    sums_ptr,  # int32 [M, G]
    K,
    num_groups,
    stride_x,
    GROUP_SIZE: tl.constexpr,
    GROUPS: tl.constexpr,
    QMAX: tl.constexpr,
):
    row = tl.program_id(0)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)  # [GROUPS]
    cols = groups[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]  # [GROUPS, GROUP_SIZE]
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
    codes, scales = quantize_rows(x, QMAX)  # [GROUPS, GROUP_SIZE], [GROUPS]
    in_range = groups < num_groups
    tl.store(codes_ptr + row * num_groups * GROUP_SIZE + cols, codes.to(tl.int8), mask=in_range[:, None])
    tl.store(scales_ptr + row * num_groups + groups, scales, mask=in_range)
    tl.store(sums_ptr + row * num_groups + groups, tl.sum(codes.to(tl.int32), axis=1), mask=in_range)


def quantize_act(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes int8 [M, Kp], scales fp32 [M, G], sums int32 [M, G]); see naive.py."""
    assert x.dim() == 2 and x.stride(1) == 1 and group_size & (group_size - 1) == 0
    m, k = x.shape
    num_groups = triton.cdiv(k, group_size)
    codes = torch.empty((m, num_groups * group_size), dtype=torch.int8, device=x.device)
    scales = torch.empty((m, num_groups), dtype=torch.float32, device=x.device)
    sums = torch.empty((m, num_groups), dtype=torch.int32, device=x.device)
    groups = max(1, min(triton.next_power_of_2(num_groups), 2048 // group_size))  # ~2K columns a program
    grid = (m, triton.cdiv(num_groups, groups))
    _quantize_act_kernel[grid](
        x, codes, scales, sums, k, num_groups, x.stride(0), GROUP_SIZE=group_size, GROUPS=groups, QMAX=QMAX
    )
    return codes, scales, sums
