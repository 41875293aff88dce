"""--cache-reuse: K/V of tokens an earlier sequence holds at other positions, copied to a new request's slots.

A token's value does not depend on its position; its key was stored rotated (RoPE, NeoX halves, the first
rotary_dim of each head) for its old position p. Rotations compose, R(p + d) = R(d) R(p), and YaRN's
attention factor scales cos and sin alike, so rotating the stored key by the shift d alone gives the key at
p + d: only the rotation's inverse frequencies are needed. Quantized keys are dequantized, rotated and
quantized again (as kv_store would); values are copied as stored, scales included.

Run by the model runner before the step's forward, after the host tier's copies; the source pages are held
by the scheduler for the step (Scheduler._pinned), so nothing else writes them meanwhile.
"""

from __future__ import annotations

import torch

from engine.cache.kv_layout import KVCache
from ninfer_kernels.kv_quant.naive import quantize_int8


def shift_kv(
    caches: list[KVCache],
    src_slots: torch.Tensor,  # [N] int64: slot = block_id * block_size + offset
    dst_slots: torch.Tensor,  # [N] int64
    shifts: torch.Tensor,  # [N] fp32: new position - old position
    inv_freq: torch.Tensor,  # [rotary_dim / 2] fp32
) -> None:
    """Copy each source slot's K/V to its destination in every cache, the key rotated by its shift."""
    angle = shifts[:, None] * inv_freq[None, :]  # [N, R/2]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]  # [N, 1, R/2]: every head alike
    half = inv_freq.numel()
    for cache in caches:
        k = _rows(cache.k_data)[src_slots].float()  # [N, Hk, D]
        if cache.k_scale is not None:
            k = k * _rows(cache.k_scale)[src_slots].float()
        x1, x2 = k[..., :half], k[..., half : 2 * half]
        k = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, k[..., 2 * half :]], dim=-1)
        v = _rows(cache.v_data)[src_slots]
        v_scale = _rows(cache.v_scale)[src_slots] if cache.v_scale is not None else None
        if cache.k_scale is not None:
            kq, ks = quantize_int8(k)
            _rows(cache.k_data)[dst_slots] = kq
            _rows(cache.k_scale)[dst_slots] = ks
        else:
            _rows(cache.k_data)[dst_slots] = k.to(cache.k_data.dtype)
        _rows(cache.v_data)[dst_slots] = v
        if v_scale is not None:
            _rows(cache.v_scale)[dst_slots] = v_scale


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[num_blocks, block_size, Hk, X] as [slots, Hk, X] (a view)."""
    return t.view(-1, *t.shape[2:])
