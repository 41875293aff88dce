from __future__ import annotations

import torch

import ninfer_kernels as kernels
from engine.layers.linear import make_param
from engine.layers.module import Module


class RMSNorm(Module):
    """RMSNorm; `zero_centered` scales by (1 + w) (Qwen3.5). forward(x, residual) fuses the residual add."""

    def __init__(self, dim: int, eps: float, zero_centered: bool = False):
        super().__init__()
        self.eps, self.zero_centered = eps, zero_centered
        self.weight = make_param(dim)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return kernels.rmsnorm(x, self.weight, self.eps, residual, self.zero_centered)


class GatedRMSNorm(Module):
    """weight * rms_norm(x) * silu(gate), per head (the Gated DeltaNet output norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = make_param(dim)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return kernels.rmsnorm_gated(x, gate, self.weight, self.eps)
