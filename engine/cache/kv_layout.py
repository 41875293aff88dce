"""KV cache dtypes: storage layout, exact bytes per token, quantize on store, dequantize on read.

Per layer, the cache of each of K and V is a data tensor [num_blocks, block_size, Hk, D'] plus, for
quantized dtypes, a scale tensor [num_blocks, block_size, Hk, S] in fp16:

| dtype | K data | K scale | V data | V scale |
| --- | --- | --- | --- | --- |
| fp32 / bf16 / fp16 | D of that dtype | - | D of that dtype | - |
| fp8 (e4m3) | D x 1 byte | - | D x 1 byte | - |
| int8 | D x int8 | 1 per token-head | D x int8 | 1 per token-head |
| k8v4 | D x int8 | 1 per token-head | D/2 bytes (two int4 per byte) | D / V4_GROUP per token-head |
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from engine.errors import NinferError
from ninfer_kernels.kv_quant.naive import SCALE_DTYPE, V4_GROUP

KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "k8v4")
ALIASES = {"rk8v4": "k8v4", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp8_e4m3": "fp8"}
_PLAIN = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


def resolve_kv_dtype(name: str, device: torch.device | str = "cpu") -> str:
    """Canonical KV dtype name; refuses unknown names and fp8 on CUDA devices below SM 8.9."""
    kv = ALIASES.get(name, name)
    if kv not in KV_DTYPES:
        raise NinferError(f"unknown KV dtype '{name}'; use one of {', '.join(KV_DTYPES)} (rk8v4 = k8v4)")
    device = torch.device(device)
    if kv == "fp8" and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise NinferError(
                f"fp8 KV needs compute capability 8.9 or newer; this GPU is {major}.{minor}; use --kv-dtype k8v4 or int8"
            )
    return kv


def bytes_per_token_per_layer(kv_dtype: str, num_kv_heads: int, head_dim: int) -> int:
    """Exact bytes one token occupies in one attention layer's K and V caches (data + scales).

    NOTE: measured on a one-token cache on the meta device, so the layout has one source: KVCache.allocate.
    """
    return KVCache.allocate(kv_dtype, 1, 1, num_kv_heads, head_dim, "meta").num_bytes


@dataclass
class KVCache:
    """One attention layer's paged K/V storage in a given KV dtype."""

    kv_dtype: str
    k_data: torch.Tensor  # [num_blocks, block_size, Hk, D]
    v_data: torch.Tensor  # [num_blocks, block_size, Hk, D] (k8v4: D / 2 uint8)
    k_scale: torch.Tensor | None = None  # [num_blocks, block_size, Hk, 1]
    v_scale: torch.Tensor | None = None  # [num_blocks, block_size, Hk, 1] (k8v4: D / V4_GROUP)

    @staticmethod
    def allocate(kv_dtype: str, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, device):
        kv = ALIASES.get(kv_dtype, kv_dtype)
        if kv not in KV_DTYPES:
            raise NinferError(
                f"unknown KV dtype '{kv_dtype}'; use one of {', '.join(KV_DTYPES)} (rk8v4 = k8v4)"
            )
        if kv == "k8v4" and head_dim % V4_GROUP:
            raise NinferError(
                f"k8v4 KV needs a head_dim divisible by {V4_GROUP} (this model: {head_dim}); use int8"
            )
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        scale_shape = (num_blocks, block_size, num_kv_heads, 1)

        # NOTE: zeros, not empty: a page slot past a sequence's end may be read as padding (naive attention
        # reads whole pages and masks), and garbage there can be NaN, which no mask hides from a dot product
        def zeros(shape, dtype):
            return torch.zeros(shape, dtype=dtype, device=device)

        if kv in _PLAIN:
            return KVCache(kv, zeros(shape, _PLAIN[kv]), zeros(shape, _PLAIN[kv]))
        k, k_scale = zeros(shape, torch.int8), zeros(scale_shape, SCALE_DTYPE)
        if kv == "int8":
            return KVCache(kv, k, zeros(shape, torch.int8), k_scale, zeros(scale_shape, SCALE_DTYPE))
        v = zeros((*shape[:3], head_dim // 2), torch.uint8)
        v_scale = zeros((*shape[:3], head_dim // V4_GROUP), SCALE_DTYPE)
        return KVCache(kv, k, v, k_scale, v_scale)

    @property
    def num_bytes(self) -> int:
        tensors = [self.k_data, self.v_data, self.k_scale, self.v_scale]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @functools.cached_property
    def flat_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k_data and v_data as [1, Hk, num_blocks * block_size, D'] views (every slot in a row, for
        attention that reads a sequence's slots in place); built once, they see every later write."""
        return tuple(t.flatten(0, 1)[None].transpose(1, 2) for t in (self.k_data, self.v_data))
