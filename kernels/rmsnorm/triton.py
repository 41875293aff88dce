"""RMSNorm kernels: one program per row, the whole row in one block (D <= 8192)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr,  # [T, D]
    residual_ptr,  # [T, D] (read, then overwritten with x + residual) when HAS_RESIDUAL
    weight_ptr,  # [D]
    out_ptr,  # [T, D]
    stride_x,
    stride_r,
    stride_o,
    D,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    # NOTE: arithmetic in fp32 with explicit roundings to the input dtype where the reference rounds
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    if HAS_RESIDUAL:
        xf = xf + tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        xf = xf.to(dtype).to(tl.float32)
        tl.store(residual_ptr + row * stride_r + cols, xf.to(dtype), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        y = xf * rstd * (1.0 + w)
    else:
        # as the reference: normalise in fp32, round to the input dtype, then scale
        y = w * (xf * rstd).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm(
    x: torch.Tensor,  # [T, D]
    weight: torch.Tensor,  # [D]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, D]
    zero_centered: bool = False,
):
    """See kernels/rmsnorm/naive.py. With `residual`, returns (normed, x + residual)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    assert x2.stride(-1) == 1, "rmsnorm needs rows contiguous in the last dim"
    num_rows, d = x2.shape
    out = torch.empty_like(x2)
    new_residual = None
    if residual is not None:
        # NOTE: x + residual lands in a fresh tensor, as the reference returns a new residual
        new_residual = residual.reshape(-1, d).clone()
    _rmsnorm_kernel[(num_rows,)](
        x2,
        new_residual if new_residual is not None else x2,
        weight,
        out,
        x2.stride(0),
        new_residual.stride(0) if new_residual is not None else 0,
        out.stride(0),
        d,
        eps,
        HAS_RESIDUAL=residual is not None,
        ZERO_CENTERED=zero_centered,
        BLOCK_D=triton.next_power_of_2(d),
    )
    out = out.reshape(shape)
    return out if residual is None else (out, new_residual.reshape(shape))


@triton.jit
def _rmsnorm_gated_kernel(
    x_ptr,  # [R, D]
    gate_ptr,  # [R, D]
    weight_ptr,  # [D]
    out_ptr,  # [R, D]
    D,
    eps,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # NOTE: one rounding fewer than the reference (w * norm stays fp32): within half an ulp of it
    y = w * (xf * rstd).to(x.dtype).to(tl.float32)
    z = tl.load(gate_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    y = y * z * tl.sigmoid(z)
    tl.store(out_ptr + row * D + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gated(
    x: torch.Tensor,  # [T, H, D]
    gate: torch.Tensor,  # [T, H, D]
    weight: torch.Tensor,  # [D]
    eps: float,
) -> torch.Tensor:
    """See kernels/rmsnorm/naive.py: weight * rms_norm(x) * silu(gate) per head."""
    d = x.shape[-1]
    x2, g2 = x.reshape(-1, d).contiguous(), gate.reshape(-1, d).contiguous()
    out = torch.empty_like(x2)
    _rmsnorm_gated_kernel[(x2.shape[0],)](x2, g2, weight, out, d, eps, BLOCK_D=triton.next_power_of_2(d))
    return out.reshape(x.shape)
