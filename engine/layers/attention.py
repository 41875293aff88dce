"""Paged attention over the KV cache, driven by the forward context."""

from __future__ import annotations

import torch

import ninfer_kernels as kernels
from engine.cache.kv_layout import KVCache
from engine.layers.module import Module
from engine.worker.forward_context import get_forward_context


class Attention(Module):
    """Stores the step's K/V at slot_mapping, then attends over each sequence's pages."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = (
            num_heads,
            num_kv_heads,
            head_dim,
            scale,
        )
        # bound by the model runner once the cache is allocated
        self.kv_cache: KVCache | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, Hq, D], k/v: [T, Hk, D] -> [T, Hq, D]
        ctx = get_forward_context()
        assert self.kv_cache is not None, "KV cache not bound: the model runner allocates it before a forward"
        kernels.kv_store(k, v, self.kv_cache, ctx.slot_mapping)
        return kernels.paged_attention(
            q,
            self.kv_cache,
            ctx.block_table,
            ctx.seq_lens,
            ctx.cu_seqlens_q,
            self.scale,
            ctx.query_tokens_per_seq,
            ctx.int8_activations,
        )
