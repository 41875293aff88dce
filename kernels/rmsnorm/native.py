"""ctypes entry of native.c; None where the arguments are outside what it computes (the caller then runs
the naive twin): fp32 only, rows with unit stride."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, library


def rmsnorm(x, weight, eps, residual=None, zero_centered=False):
    f32 = torch.float32
    if x.dtype != f32 or weight.dtype != f32 or not weight.is_contiguous() or x.stride(-1) != 1:
        return None
    if x.dim() != 2:
        if not x.is_contiguous():
            return None
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
    else:
        shape = None
    if residual is not None and (
        residual.dtype != f32 or residual.shape != x.shape or not residual.is_contiguous()
    ):
        return None
    rows, dim = x.shape
    if weight.shape != (dim,):
        return None  # the twin names the mismatch
    out = torch.empty(rows, dim, dtype=f32)
    new_residual = None if residual is None else torch.empty(rows, dim, dtype=f32)
    rc = library().ninfer_rmsnorm(
        x.data_ptr(),
        None if residual is None else residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        None if new_residual is None else new_residual.data_ptr(),
        rows,
        dim,
        x.stride(0),
        eps,
        int(zero_centered),
    )
    check(rc, "rmsnorm")
    if shape is not None:
        out = out.view(shape)
    return out if residual is None else (out, new_residual)


def rmsnorm_gated(x, gate, weight, eps):
    """x [T, H, D] fp32, gate [T, H, D] with heads D apart (tokens any stride apart), weight [D]."""
    f32 = torch.float32
    if x.dtype != f32 or gate.dtype != f32 or weight.dtype != f32 or x.dim() != 3 or gate.shape != x.shape:
        return None
    tokens, heads, dim = x.shape
    gate_ok = gate.stride(2) == 1 and gate.stride(1) == dim
    if not (gate_ok and x.is_contiguous() and weight.is_contiguous() and weight.shape == (dim,)):
        return None
    out = torch.empty(tokens, heads, dim)
    rc = library().ninfer_rmsnorm_gated(
        x.data_ptr(),
        gate.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        tokens,
        heads,
        dim,
        gate.stride(0),
        eps,
    )
    check(rc, "rmsnorm_gated")
    return out
