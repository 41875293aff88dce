"""ctypes entry of native.c; None where it does not apply (the caller then runs the naive twin): fp32 x
with unit channel stride (rows any stride apart), a contiguous fp32 weight and state, int32 metadata."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, library

MAX_KERNEL = 16


def causal_conv1d(x, weight, conv_state, cu_seqlens, state_indices, apply_silu=True):
    f32 = torch.float32
    if x.dtype != f32 or x.dim() != 2 or x.stride(1) != 1 or weight.dtype != f32 or conv_state.dtype != f32:
        return None
    (num_tokens, channels), kernel = x.shape, weight.shape[-1]
    layout_ok = weight.is_contiguous() and conv_state.is_contiguous() and weight.shape == (channels, kernel)
    meta_ok = cu_seqlens.dtype == torch.int32 and state_indices.dtype == torch.int32
    if not (
        layout_ok and meta_ok and kernel <= MAX_KERNEL and conv_state.shape[1:] == (channels, kernel - 1)
    ):
        return None
    cu, slots = cu_seqlens.contiguous(), state_indices.contiguous()
    if cu.shape[0] != slots.shape[0] + 1:
        return None
    out = torch.empty(num_tokens, channels)
    rc = library().ninfer_causal_conv1d(
        x.data_ptr(),
        weight.data_ptr(),
        conv_state.data_ptr(),
        out.data_ptr(),
        cu.data_ptr(),
        slots.data_ptr(),
        num_tokens,
        slots.shape[0],
        channels,
        kernel,
        x.stride(0),
        conv_state.shape[0],
        int(apply_silu),
    )
    check(rc, "causal_conv1d")
    return out
