"""Write the step's K/V into the paged cache at slot_mapping, quantizing for the cache's KV dtype.

One program per (token, kv head). Quantization matches kernels/kv_quant/naive.py: int8 symmetric with
one fp16 scale per token-head; int4 V in groups of V4_GROUP dims, two values per byte, low nibble first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.kv_quant.naive import MIN_SCALE, V4_GROUP

_PLAIN, _INT8, _K8V4 = 0, 1, 2


@triton.jit
def _round_half_even(x):
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _store_int8(x, data_ptr, scale_ptr, row, cols, mask, D, MIN_SCALE: tl.constexpr):
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(amax / 127.0, MIN_SCALE).to(tl.float16)
    q = _round_half_even(x / scale.to(tl.float32))
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    tl.store(data_ptr + row * D + cols, q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _kv_store_kernel(
    k_ptr,  # [T, Hk, D]
    v_ptr,  # [T, Hk, D]
    slot_mapping_ptr,  # [T] int64
    k_data_ptr,  # [num_slots, Hk, D'] (flattened pages)
    v_data_ptr,
    k_scale_ptr,  # [num_slots, Hk, 1] fp16 (quantized dtypes)
    v_scale_ptr,  # [num_slots, Hk, 1 or D / V4_GROUP] fp16
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    Hk,
    D,
    MODE: tl.constexpr,
    V4_GROUP: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + t)
    if slot < 0:
        return  # a padding token
    row = slot * Hk + h  # row of [num_slots * Hk] head vectors
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + cols, mask=mask, other=0.0)
    if MODE == 0:  # plain: a cast
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + cols, mask=mask, other=0.0)
        tl.store(k_data_ptr + row * D + cols, k.to(k_data_ptr.dtype.element_ty), mask=mask)
        tl.store(v_data_ptr + row * D + cols, v.to(v_data_ptr.dtype.element_ty), mask=mask)
    else:
        _store_int8(k.to(tl.float32), k_data_ptr, k_scale_ptr, row, cols, mask, D, MIN_SCALE)
        if MODE == 1:
            v = tl.load(v_ptr + t * stride_vt + h * stride_vh + cols, mask=mask, other=0.0)
            _store_int8(v.to(tl.float32), v_data_ptr, v_scale_ptr, row, cols, mask, D, MIN_SCALE)
        else:
            # int4 V: [G, V4_GROUP / 2] tiles of the even and the odd dims of each group
            NUM_GROUPS: tl.constexpr = BLOCK_D // V4_GROUP
            HALF_GROUP: tl.constexpr = V4_GROUP // 2
            g = tl.arange(0, NUM_GROUPS)[:, None]
            i = tl.arange(0, HALF_GROUP)[None, :]
            even_cols = g * V4_GROUP + 2 * i
            gm = even_cols < D
            base = v_ptr + t * stride_vt + h * stride_vh
            even = tl.load(base + even_cols, mask=gm, other=0.0).to(tl.float32)
            odd = tl.load(base + even_cols + 1, mask=gm, other=0.0).to(tl.float32)
            amax = tl.maximum(tl.max(tl.abs(even), axis=1), tl.max(tl.abs(odd), axis=1))  # [G]
            scale = tl.maximum(amax / 7.0, MIN_SCALE).to(tl.float16)
            sf = scale.to(tl.float32)[:, None]
            q_even = tl.minimum(tl.maximum(_round_half_even(even / sf), -7.0), 7.0) + 8.0
            q_odd = tl.minimum(tl.maximum(_round_half_even(odd / sf), -7.0), 7.0) + 8.0
            packed = q_even.to(tl.int32) | (q_odd.to(tl.int32) << 4)
            tl.store(v_data_ptr + row * (D // 2) + g * HALF_GROUP + i, packed.to(tl.uint8), mask=gm)
            num_groups = D // V4_GROUP
            gs = tl.arange(0, NUM_GROUPS)
            tl.store(v_scale_ptr + row * num_groups + gs, scale, mask=gs < num_groups)


def kv_store(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    cache,  # engine.cache.kv_layout.KVCache
    slot_mapping: torch.Tensor,  # [T] int64; -1 = skip
) -> None:
    """See kernels/kv_store/naive.py."""
    num_tokens, num_kv_heads, head_dim = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and cache.k_data.is_contiguous()
    if num_tokens == 0:
        return
    mode = {"int8": _INT8, "k8v4": _K8V4}.get(cache.kv_dtype, _PLAIN)
    dummy = cache.k_data
    _kv_store_kernel[(num_tokens, num_kv_heads)](
        k,
        v,
        slot_mapping,
        cache.k_data,
        cache.v_data,
        cache.k_scale if cache.k_scale is not None else dummy,
        cache.v_scale if cache.v_scale is not None else dummy,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        num_kv_heads,
        head_dim,
        MODE=mode,
        V4_GROUP=V4_GROUP,
        MIN_SCALE=MIN_SCALE,
        BLOCK_D=max(triton.next_power_of_2(head_dim), V4_GROUP),
    )
