"""KV quantization shared by kv_store (quantize on write) and paged_attention (dequantize on read)."""

from __future__ import annotations

import torch

V4_GROUP = 32  # head_dim elements sharing one V int4 scale
SCALE_DTYPE = torch.float16
MIN_SCALE = 2.0**-14  # the smallest normal fp16: an all-zero row keeps a usable scale
# fp8 dtypes: the CPU has no index_select / index_copy_ kernel for them, so they take advanced indexing
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per [..., D] row: x ~ q * scale. Returns q [..., D] int8, scale [..., 1] fp16."""
    scale = (x.float().abs().amax(-1, keepdim=True) / 127.0).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
    q = (x.float() / scale.float()).round().clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4_grouped(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 in groups of V4_GROUP along D, two values per byte (low nibble first).

    Returns packed [..., D/2] uint8 and scale [..., D/V4_GROUP] fp16.
    """
    groups = x.float().unflatten(-1, (-1, V4_GROUP))  # [..., G, V4_GROUP]
    scale = (groups.abs().amax(-1, keepdim=True) / 7.0).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
    q = (groups / scale.float()).round().clamp(-7, 7).to(torch.int8).flatten(-2) + 8  # [..., D] in 1..15
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8)
    return packed, scale.squeeze(-1)


def dequantize_int4_grouped(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    low = (packed & 0xF).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    q = torch.stack([low, high], dim=-1).flatten(-2).float()  # [..., D]
    return (q.unflatten(-1, (-1, V4_GROUP)) * scale.float().unsqueeze(-1)).flatten(-2)


def read_kv(cache, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of pages `blocks` [..., nb] in order, dequantized: k, v [..., nb * block_size, Hk, D] fp32."""

    def flat(t):
        if t.dtype in FP8_DTYPES:
            pages = t[blocks]
        else:  # index_select: the same pages, about twice as fast as advanced indexing here
            pages = t.index_select(0, blocks.reshape(-1).long()).view(*blocks.shape, *t.shape[1:])
        return pages.flatten(-4, -3)  # [..., nb, bs, Hk, X] -> [..., nb * bs, Hk, X]

    k = flat(cache.k_data).to(torch.float32)
    if cache.k_scale is not None:
        k = k * flat(cache.k_scale).float()
    if cache.kv_dtype == "k8v4":
        v = dequantize_int4_grouped(flat(cache.v_data), flat(cache.v_scale))
    else:
        v = flat(cache.v_data).float()
        if cache.v_scale is not None:
            v = v * flat(cache.v_scale).float()
    return k, v
