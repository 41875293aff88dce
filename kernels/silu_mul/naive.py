import torch


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] laid out as [gate | up] -> silu(gate) * up: [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
