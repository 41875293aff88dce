"""An NVFP4 / MXFP4 linear weight held as its checkpoint stores it, multiplied by kernels/fp4_matmul (4.5 / 4.25
bits a weight: about half the bytes of the 8-bit groups it was held as before, so decode reads about half
as much)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import ninfer_kernels as kernels
from engine.formats.hf_fp4 import Fp4Tensor
from ninfer_kernels.fp4_matmul import GROUPS


@dataclass
class Fp4Weight:
    packed: torch.Tensor  # uint8 [N, K / 2]
    scale_codes: torch.Tensor  # uint8 [N, G]
    multiplier: torch.Tensor  # fp32 [N]
    group_size: int
    e8m0: bool
    k: int

    @staticmethod
    def from_shards(shards: list[Fp4Tensor], device: torch.device | str) -> Fp4Weight:
        """One weight from checkpoint matrices fused along the output dim (q|k|v, gate|up): rows concatenated,
        each keeping its own tensor scale (its rows' multipliers)."""
        first = shards[0]
        assert all(fp4_layout(s) == fp4_layout(first) for s in shards)

        def cat(ts: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat(ts, dim=0).to(device).contiguous()

        return Fp4Weight(
            packed=cat([s.packed for s in shards]),
            scale_codes=cat([s.scale_codes for s in shards]),
            multiplier=cat([s.multiplier.float() for s in shards]),
            group_size=first.group_size,
            e8m0=first.e8m0,
            k=first.shape[1],
        )

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale_codes, self.multiplier))

    def first_rows(self, n: int) -> Fp4Weight:
        """The first `n` output rows, as views of the same storage."""
        return replace(
            self, packed=self.packed[:n], scale_codes=self.scale_codes[:n], multiplier=self.multiplier[:n]
        )

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, xq=None) -> torch.Tensor:
        # x: [M, K] -> [M, N] (into out, a view of a wider output's columns, where given); xq: unused (the
        # int8 activations of engine/quant/layer.ConcatenatedWeights' integer parts)
        args = (self.packed, self.scale_codes, self.multiplier, self.group_size, self.e8m0)
        return kernels.fp4_matmul(x, *args, out)

    def takes_int8(self, x: torch.Tensor) -> bool:
        """(--int8-prefill multiplies integer groups only.)"""
        return False


@dataclass
class DenseRows:
    """A fused projection's shards an FP4 checkpoint keeps 16-bit beside its FP4 ones (Qwen3.5's in_proj_b /
    in_proj_a, say): their rows as a dense matrix, one part of engine/quant/layer.ConcatenatedWeights."""

    weight: torch.Tensor  # [N, K] in the model dtype

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, xq=None) -> torch.Tensor:
        y = x @ self.weight.t()  # [M, N]
        return y if out is None else out.copy_(y)

    def takes_int8(self, x: torch.Tensor) -> bool:
        return False


def fp4_layout(t: Fp4Tensor) -> tuple[int, bool, int]:
    """What shards must share to be one Fp4Weight: group, scale codes, K."""
    return t.group_size, t.e8m0, t.shape[1]


def fp4_kernel_takes(shards: list[Fp4Tensor]) -> bool:
    """Whether kernels/fp4_matmul multiplies these shards as one weight: one layout, a group it takes, K even."""
    first = shards[0]
    return (
        all(fp4_layout(s) == fp4_layout(first) for s in shards)
        and GROUPS.get(first.group_size) == ("e8m0" if first.e8m0 else "e4m3")
        and first.shape[1] % 2 == 0
    )
