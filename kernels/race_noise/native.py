"""ctypes entry of native.c; None outside what it computes (int64 keys in one row)."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, library


def race_noise(keys, vocab):
    if keys.dtype != torch.int64 or keys.dim() != 1:
        return None
    keys = keys.contiguous()
    out = torch.empty(keys.shape[0], vocab, dtype=torch.float32)
    check(library().ninfer_race_noise(keys.data_ptr(), out.data_ptr(), keys.shape[0], vocab), "race_noise")
    return out
