"""The adapters' low-rank pairs on one linear layer, added to its output for the rows that asked for them."""

from __future__ import annotations

import torch

from engine.lora.peft import LoraPair
from engine.worker.forward_context import current_forward_context


class LoraWeights:
    """Per adapter slot, the layer's A [R, in] and B [out, R]: a fused layer's shards stacked along R,
    each shard's B in its own rows (zeros elsewhere), so one pair of matmuls serves q, k and v alike."""

    def __init__(self, out_features: int):
        self.out_features = out_features
        self.pairs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def add_adapter(self, slot: int, pairs: list[LoraPair], dtype: torch.dtype, device) -> None:
        a = torch.cat([p.a for p in pairs])  # [R, in]
        b = torch.zeros(self.out_features, a.shape[0])  # [out, R]
        col = 0
        for p in pairs:
            start, size = p.rows
            r = p.a.shape[0]
            b[start : start + size, col : col + r] = p.b
            col += r
        self.pairs[slot] = (a.to(device, dtype), b.to(device, dtype))

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.pairs.values() for t in pair)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # x: [T, in], y: [T, out] -> y plus each step row's adapter delta
        ctx = current_forward_context()
        if ctx is None:
            return y
        if ctx.lora_lanes is not None:  # a CUDA graph's step: every lane, each row weighted by its scale
            for slot in range(ctx.lora_lanes.shape[0]):
                pair = self.pairs.get(slot)
                if pair is not None:
                    a, b = pair
                    weights = ctx.lora_lanes[slot].unsqueeze(1)  # [T, 1]
                    y = y + (((x.to(a.dtype) @ a.t()) * weights) @ b.t()).to(y.dtype)
            return y
        for slot, rows, scale in ctx.lora:
            pair = self.pairs.get(slot)
            if pair is None:  # the adapter leaves this layer alone
                continue
            a, b = pair
            if rows is None:  # every row of the step runs this adapter: y + scale * (x A^T) B^T, fused
                if y.dtype == a.dtype:
                    y = torch.addmm(y, x.to(a.dtype) @ a.t(), b.t(), alpha=scale)
                else:
                    y = y + (scale * ((x.to(a.dtype) @ a.t()) @ b.t())).to(y.dtype)
            else:  # rows: [n] int64
                delta = (x.index_select(0, rows).to(a.dtype) @ a.t()) @ b.t()  # [n, out]
                y = y.index_add(0, rows, delta.to(y.dtype), alpha=scale)
        return y
