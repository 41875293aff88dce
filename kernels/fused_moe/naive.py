from __future__ import annotations

from typing import NamedTuple

import torch

from ninfer_kernels.fp4_matmul.naive import dequantize_weight as dequantize_fp4
from ninfer_kernels.quant_matmul.naive import dequantize_weight


class PackedExperts(NamedTuple):
    """Every expert's matrix [N, K] group-wise quantized alike (engine/quant/groupwise.py's layout),
    stacked: packed [E, N, ...], scales / minimums [E, N, G]. `columns` int32 [E, K] (act-order
    checkpoints): expert e's stored column j holds input column columns[e, j] (its groups gathered from
    scattered columns); None: in order."""

    packed: torch.Tensor
    scales: torch.Tensor
    minimums: torch.Tensor | None
    bits: int
    group_size: int
    k: int
    columns: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K), as a dense stack's."""
        return self.scales.shape[0], self.scales.shape[1], self.k

    @property
    def nbytes(self) -> int:
        """Bytes held: codes, scales, minimums and column orders."""
        return sum(t.nbytes for t in (self.packed, self.scales, self.minimums, self.columns) if t is not None)

    def dequantize(self) -> torch.Tensor:
        """fp32 [E, N, K], columns in the input's order."""
        out = []
        for e in range(self.packed.shape[0]):
            mins = None if self.minimums is None else self.minimums[e]
            columns = None if self.columns is None else self.columns[e]
            w = dequantize_weight(
                self.packed[e], self.scales[e], mins, self.bits, self.group_size, self.k, columns
            )
            out.append(w)
        return torch.stack(out)


class Fp4Experts(NamedTuple):
    """Every expert's matrix [N, K] as an NVFP4 / MXFP4 checkpoint stores it (kernels/fp4_matmul's layout, K
    a multiple of the group), stacked: packed uint8 [E, N, K / 2], scale_codes uint8 [E, N, K / group],
    multiplier fp32 [E, N]."""

    packed: torch.Tensor
    scale_codes: torch.Tensor
    multiplier: torch.Tensor
    group_size: int
    e8m0: bool
    k: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K), as a dense stack's."""
        return self.packed.shape[0], self.packed.shape[1], self.k

    @property
    def nbytes(self) -> int:
        """Bytes held: codes, scale codes and row multipliers."""
        return self.packed.nbytes + self.scale_codes.nbytes + self.multiplier.nbytes

    def dequantize(self) -> torch.Tensor:
        """fp32 [E, N, K]."""
        return torch.stack(
            [
                dequantize_fp4(
                    self.packed[e],
                    self.scale_codes[e],
                    self.multiplier[e],
                    self.group_size,
                    self.e8m0,
                    self.k,
                )
                for e in range(self.packed.shape[0])
            ]
        )


def moe_route(
    router_logits: torch.Tensor,  # [T, E]
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [T, top_k], expert ids int64 [T, top_k]): softmax over all experts in fp32, the top_k
    largest (ties: the lower id first), renormalised to sum to 1 when `renormalize`."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def fused_moe(
    x: torch.Tensor,  # [T, H]
    gate_up: torch.Tensor
    | PackedExperts
    | Fp4Experts,  # [E, 2I, H]: each expert's gate rows, then its up rows
    down: torch.Tensor | PackedExperts | Fp4Experts,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] fp32
    topk_ids: torch.Tensor,  # [T, k]
) -> torch.Tensor:
    """sum_j w_j down_e(silu(gate_e x) * up_e x) over each token's chosen experts e = ids[t, j]: [T, H] in
    x's dtype, each expert's products in x's dtype, the weighted sum in fp32. Tokens are grouped by expert
    (one sort), each expert multiplying its group once. Packed experts are dequantized first (to x's
    dtype)."""
    if isinstance(gate_up, (PackedExperts, Fp4Experts)):
        gate_up = gate_up.dequantize().to(x.dtype)
    if isinstance(down, (PackedExperts, Fp4Experts)):
        down = down.dequantize().to(x.dtype)
    num_tokens, k = topk_ids.shape
    flat = topk_ids.reshape(-1)  # [T k]
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    token_of = order // k  # [T k]: the token of each sorted assignment
    weight_of = topk_weights.reshape(-1)[order]
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[start : start + count]
        h = x[rows] @ gate_up[expert].t()  # [n, 2I]
        g, u = h.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(g) * u) @ down[expert].t()  # [n, H]
        out.index_add_(0, rows, y.float() * weight_of[start : start + count, None])
        start += count
    return out.to(x.dtype)
