"""ctypes entry of native.c; None where it does not apply (the caller then runs the naive twin): fp32 q / k
/ v whose heads are D floats apart (views into the conv output are), an fp32 contiguous state, int32
metadata, head dims up to 512."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, heads_packed, library

MAX_DIM = 512


def gated_delta_rule(q, k, v, g, beta, state, cu_seqlens, state_indices, use_qk_l2norm=True):
    if not (heads_packed(q) and heads_packed(k) and heads_packed(v)) or q.shape != k.shape:
        return None
    (num_tokens, hk, dk), (hv, dv) = q.shape, v.shape[1:]
    gates_ok = g.shape == (num_tokens, hv) and beta.shape == (num_tokens, hv)
    shapes_ok = gates_ok and v.shape[0] == num_tokens and hv % hk == 0 and max(dk, dv) <= MAX_DIM
    state_ok = state.dtype == torch.float32 and state.is_contiguous() and state.shape[1:] == (hv, dk, dv)
    meta_ok = cu_seqlens.dtype == torch.int32 and state_indices.dtype == torch.int32
    if not (shapes_ok and state_ok and meta_ok and cu_seqlens.shape[0] == state_indices.shape[0] + 1):
        return None
    g, beta = g.float().contiguous(), beta.float().contiguous()  # [T, Hv]
    cu, slots = cu_seqlens.contiguous(), state_indices.contiguous()
    out = torch.empty(num_tokens, hv, dv)
    rc = library().ninfer_gated_delta_rule(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        g.data_ptr(),
        beta.data_ptr(),
        state.data_ptr(),
        out.data_ptr(),
        cu.data_ptr(),
        slots.data_ptr(),
        num_tokens,
        slots.shape[0],
        hk,
        hv,
        dk,
        dv,
        q.stride(0),
        k.stride(0),
        v.stride(0),
        state.shape[0],
        int(use_qk_l2norm),
    )
    check(rc, "gated_delta_rule")
    return out
