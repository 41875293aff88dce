"""The dense gated MLP of Llama / Qwen: down(silu(gate(x)) * up(x)), gate and up fused."""

from __future__ import annotations

import torch

import ninfer_kernels as kernels
from engine.layers.linear import Linear, MergedLinear
from engine.layers.module import Module


class GatedMLP(Module):
    """down(silu(gate(x)) * up(x)), gate and up fused."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden_size, {"gate": intermediate_size, "up": intermediate_size})
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(kernels.silu_mul(self.gate_up_proj(x)))
