"""ctypes entry of native.c; None outside what it computes: fp32 q / k [T, H, D] whose heads are D floats
apart (views into the fused qkv output are), int64 positions, a contiguous fp32 cos/sin cache."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, heads_packed, library


def rope(q, k, positions, cos_sin_cache):
    if not (heads_packed(q) and heads_packed(k)) or q.shape[2] != k.shape[2] or q.shape[0] != k.shape[0]:
        return None
    if positions.dtype != torch.int64 or not positions.is_contiguous() or positions.shape != q.shape[:1]:
        return None
    if cos_sin_cache.dtype != torch.float32 or not cos_sin_cache.is_contiguous():
        return None
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] > q.shape[2] or cos_sin_cache.shape[1] % 2:
        return None
    (t, hq, d), hk = q.shape, k.shape[1]
    q_out = torch.empty(t, hq, d, dtype=torch.float32)
    k_out = torch.empty(t, hk, d, dtype=torch.float32)
    rc = library().ninfer_rope(
        q.data_ptr(),
        k.data_ptr(),
        q_out.data_ptr(),
        k_out.data_ptr(),
        positions.data_ptr(),
        cos_sin_cache.data_ptr(),
        t,
        hq,
        hk,
        d,
        q.stride(0),
        k.stride(0),
        cos_sin_cache.shape[0],
        cos_sin_cache.shape[1],
    )
    check(rc, "rope")
    return q_out, k_out
