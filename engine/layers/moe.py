"""Qwen3-MoE's sparse MLP: a router chooses top_k of num_experts gated MLPs per token; their outputs are
weighted by the router's probabilities and summed (kernels.moe_route, kernels.fused_moe)."""

from __future__ import annotations

import re

import torch

import kernels
from engine.config import ModelConfig
from engine.layers.linear import Linear, make_param
from engine.layers.module import Module

# one expert's matrix as the hub stores it: model.layers.<i>.mlp.experts.<e>.<kind>_proj.weight
EXPERT_TENSOR = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def is_expert_tensor(name: str) -> bool:
    """Whether a checkpoint tensor is one expert's matrix (loaded into the stacked experts)."""
    return EXPERT_TENSOR.match(name) is not None


class Experts(Module):
    """Every expert's weights stacked: gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj
    [E, H, I], as transformers holds them. A checkpoint stores either these two tensors, or each expert's
    gate_proj / up_proj / down_proj: shards named "gate:e", "up:e", "down:e"."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.intermediate_size = intermediate_size
        experts = range(num_experts)
        self.gate_up_proj = make_param(
            num_experts,
            2 * intermediate_size,
            hidden_size,
            loader=self._load,
            shards={f"{kind}:{e}": None for kind in ("gate", "up") for e in experts},
        )
        self.down_proj = make_param(
            num_experts,
            hidden_size,
            intermediate_size,
            loader=self._load,
            shards={f"down:{e}": None for e in experts},
        )

    def _load(self, param: torch.nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        if shard_id is None:  # the stacked tensor
            target = param.data
        else:
            kind, expert = shard_id.split(":")
            target = param.data[int(expert)]
            if kind != "down":
                size = self.intermediate_size
                target = target.narrow(0, 0 if kind == "gate" else size, size)
        if target.shape != loaded.shape:
            raise ValueError(
                f"shape mismatch for {shard_id or 'the stacked experts'}: parameter {tuple(target.shape)} vs "
                f"checkpoint {tuple(loaded.shape)}"
            )
        target.copy_(loaded)


class SparseMoE(Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = Linear(config.hidden_size, config.num_experts)  # the router
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, H] -> [T, H]
        weights, ids = kernels.moe_route(self.gate(x), self.top_k, self.renormalize)  # [T, k] each
        return kernels.fused_moe(x, self.experts.gate_up_proj, self.experts.down_proj, weights, ids)
