"""ctypes entry of native.c; False where it does not apply (the caller then runs the naive twin): a cache
of any KV dtype but fp8, fp32 K / V rows whose heads are D floats apart, int64 slots."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import KV_MODES, cache_readable, check, heads_packed, library


def kv_store(k, v, cache, slot_mapping) -> bool:
    kc, vc, ks, vs = cache.k_data, cache.v_data, cache.k_scale, cache.v_scale
    mode = KV_MODES.get(cache.kv_dtype)
    if mode is None or not (heads_packed(k) and heads_packed(v)) or k.shape != v.shape:
        return False
    if (
        slot_mapping.dtype != torch.int64
        or not slot_mapping.is_contiguous()
        or slot_mapping.shape != k.shape[:1]
    ):
        return False
    if not cache_readable(cache) or kc.shape[2:] != k.shape[1:]:
        return False
    num_slots = kc.shape[0] * kc.shape[1]
    rc = library().ninfer_kv_store(
        k.data_ptr(),
        v.data_ptr(),
        kc.data_ptr(),
        vc.data_ptr(),
        None if ks is None else ks.data_ptr(),
        None if vs is None else vs.data_ptr(),
        slot_mapping.data_ptr(),
        k.shape[0],
        k.stride(0),
        v.stride(0),
        k.shape[1],
        k.shape[2],
        num_slots,
        mode,
    )
    check(rc, "kv_store")
    return True
