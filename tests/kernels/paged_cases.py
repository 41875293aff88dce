"""Paged caches with scattered pages for the attention tests (Triton and native against the naive twin)."""

from __future__ import annotations

import torch

from engine.cache.kv_layout import KVCache
from ninfer_kernels.kv_store import naive as kv_store_naive


def paged_case(kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, prefix, new, dtype, device):
    """A paged cache holding sequences of prefix + new tokens (pages scattered), and queries for the new
    ones: (q, cache, block_table, seq_lens, cu_seqlens_q)."""

    def randn(*shape):
        return torch.randn(*shape, device=device)

    num_blocks = sum(-(-(p + n) // block_size) for p, n in zip(prefix, new)) + 3
    cache = KVCache.allocate(kv_dtype, num_blocks, block_size, num_kv_heads, head_dim, device)
    free = torch.randperm(num_blocks).tolist()
    width = max(-(-(p + n) // block_size) for p, n in zip(prefix, new)) + 1
    tables = []
    for p, n in zip(prefix, new):
        total = p + n
        blocks = [free.pop() for _ in range(-(-total // block_size))]
        tables.append(blocks + [0] * (width - len(blocks)))
        slots = torch.tensor([blocks[i // block_size] * block_size + i % block_size for i in range(total)])
        kv_store_naive.kv_store(
            randn(total, num_kv_heads, head_dim),
            randn(total, num_kv_heads, head_dim),
            cache,
            slots.to(device),
        )
    q = randn(sum(new), num_q_heads, head_dim).to(dtype)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([p + n for p, n in zip(prefix, new)], dtype=torch.int32, device=device)
    return q, cache, torch.tensor(tables, dtype=torch.int32, device=device), seq_lens, cu
