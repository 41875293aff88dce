"""ctypes entry of native.c; None outside what it computes (fp32 rows [gate | up] with unit stride)."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, library


def silu_mul(x):
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(-1) != 1 or x.shape[-1] % 2:
        return None
    rows, width = x.shape
    out = torch.empty(rows, width // 2, dtype=torch.float32)
    check(library().ninfer_silu_mul(x.data_ptr(), out.data_ptr(), rows, width // 2, x.stride(0)), "silu_mul")
    return out
