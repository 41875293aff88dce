"""The sparse MLP of Qwen3-MoE and Qwen3.5-MoE: a router chooses top_k of num_experts gated MLPs per token;
their outputs are weighted by the router's probabilities and summed (kernels.moe_route, kernels.fused_moe);
Qwen3.5-MoE adds a shared expert, a dense gated MLP every token takes, scaled by a sigmoid gate."""

from __future__ import annotations

import re

import torch

import ninfer_kernels as kernels
from engine.config import ModelConfig
from engine.formats.hf_fp4 import Fp4Tensor
from engine.layers.linear import Linear, make_param
from engine.layers.mlp import GatedMLP
from engine.layers.module import Module
from engine.quant.fp4_layer import fp4_kernel_takes
from engine.quant.groupwise import QuantizedTensor
from engine.quant.layer import fused_kernel_takes
from ninfer_kernels.fused_moe.naive import Fp4Experts, PackedExperts

# one expert's matrix as the hub stores it: model.layers.<i>.mlp.experts.<e>.<kind>_proj.weight
_EXPERT_TENSOR = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def expert_shard(name: str) -> tuple[str, str] | None:
    """(stacked experts parameter, shard) a checkpoint tensor of one expert loads into: `<...>.experts.
    gate_up_proj` with shard "gate:e" / "up:e", or `.down_proj` with "down:e"; None for any other tensor."""
    expert = _EXPERT_TENSOR.match(name)
    if expert is None:
        return None
    base, index, kind = expert.groups()
    return f"{base}.{'down_proj' if kind == 'down' else 'gate_up_proj'}", f"{kind}:{index}"


def stack_stays_packed(layouts: set[tuple[int, int, int]]) -> bool:
    """Whether a stacked experts parameter is held packed, given the (bits, group size, K) of its experts'
    matrices: all alike, at a width and group the fused kernels take (else dequantized into the stack)."""
    if len(layouts) != 1:
        return False
    bits, group, _ = next(iter(layouts))
    return fused_kernel_takes(bits, group)


class Experts(Module):
    """Every expert's weights stacked: gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj
    [E, H, I], as transformers holds them. A checkpoint stores either these two tensors, or each expert's
    gate_proj / up_proj / down_proj: shards named "gate:e", "up:e", "down:e". Kept packed (a .ninfer on
    the GPU), each is a PackedExperts in `packed` instead, its parameter None; kept as an FP4 checkpoint
    stores it, an Fp4Experts."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.packed: dict[str, PackedExperts | Fp4Experts] = {}
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


def make_mlp(config: ModelConfig, sparse: bool) -> Module:
    """A decoder layer's MLP: the mixture of experts where `sparse`, else the dense gated MLP."""
    return SparseMoE(config) if sparse else GatedMLP(config.hidden_size, config.intermediate_size)


class SparseMoE(Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h = config.hidden_size
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = Linear(h, config.num_experts)  # the router
        self.experts = Experts(config.num_experts, h, config.moe_intermediate_size)
        shared = config.shared_expert_intermediate_size
        self.shared_expert = GatedMLP(h, shared) if shared else None
        self.shared_expert_gate = Linear(h, 1) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, H] -> [T, H]
        weights, ids = kernels.moe_route(self.gate(x), self.top_k, self.renormalize)  # [T, k] each
        experts = self.experts
        gate_up = experts.packed.get("gate_up_proj", experts.gate_up_proj)
        down = experts.packed.get("down_proj", experts.down_proj)
        out = kernels.fused_moe(x, gate_up, down, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def _expert_columns(per_expert: list[list[QuantizedTensor]], k: int) -> torch.Tensor | None | bool:
    """The column orders of act-order experts, int32 [E, K] (an expert in order: arange), None where every
    expert is in order, False where an expert's gate and up differ in order (then dequantized: the kernel
    gathers x once for an expert's concatenated rows)."""
    if all(q.columns is None for qs in per_expert for q in qs):
        return None
    in_order = torch.arange(k, dtype=torch.int32)
    orders = [[in_order if q.columns is None else q.columns for q in qs] for qs in per_expert]
    if any(not torch.equal(o, os[0]) for os in orders for o in os[1:]):
        return False
    return torch.stack([os[0] for os in orders])


def pack_experts(model: torch.nn.Module, pname: str, param, shards: dict, device) -> bool:
    """Keep a stacked experts parameter packed (load_keeping_quantized): when every expert's matrix (every
    shard) is quantized at one width and group the kernel takes, stack them into a PackedExperts on the
    Experts module (gate and up rows concatenated per expert) and drop the dense parameter. False where
    `param` is not an experts matrix, or is not quantized alike."""
    module_name, _, attr = pname.rpartition(".")
    module = model.get_submodule(module_name) if module_name else None
    if not isinstance(module, Experts) or set(shards) != set(param.shard_names):
        return False
    if not stack_stays_packed({(q.bits, q.group_size, q.shape[1]) for q in shards.values()}):
        return False
    first = next(iter(shards.values()))
    kinds = ("down",) if attr == "down_proj" else ("gate", "up")
    per_expert: list[list[QuantizedTensor]] = [
        [shards[f"{k}:{e}"] for k in kinds] for e in range(module.num_experts)
    ]
    columns = _expert_columns(per_expert, first.shape[1])
    if columns is False:
        return False

    def stack(field: str) -> torch.Tensor:
        return torch.stack([torch.cat([getattr(q, field) for q in qs]) for qs in per_expert]).to(device)

    module.packed[attr] = PackedExperts(
        stack("packed"),
        stack("scales"),
        stack("minimums") if first.minimums is not None else None,
        first.bits,
        first.group_size,
        first.shape[1],
        None if columns is None else columns.to(device),
    )
    setattr(module, attr, None)
    return True


def pack_fp4_experts(model: torch.nn.Module, pname: str, param, shards: dict, device) -> bool:
    """Keep a stacked experts parameter as an FP4 checkpoint stores it (load_keeping_quantized): when every
    expert's matrix is FP4 in one layout the kernel takes (K a multiple of the group), stack them into an
    Fp4Experts on the Experts module (gate and up rows concatenated per expert, each keeping its tensor
    scale) and drop the dense parameter. False where `param` is not an experts matrix, or is not so."""
    module_name, _, attr = pname.rpartition(".")
    module = model.get_submodule(module_name) if module_name else None
    if not isinstance(module, Experts) or set(shards) != set(param.shard_names):
        return False
    tensors = list(shards.values())
    first = tensors[0]
    if not all(isinstance(t, Fp4Tensor) for t in tensors) or not fp4_kernel_takes(tensors):
        return False
    if first.shape[1] % first.group_size:
        return False
    kinds = ("down",) if attr == "down_proj" else ("gate", "up")
    per_expert = [[shards[f"{k}:{e}"] for k in kinds] for e in range(module.num_experts)]

    def stack(field: str) -> torch.Tensor:
        return torch.stack([torch.cat([getattr(t, field) for t in ts]) for ts in per_expert]).to(device)

    module.packed[attr] = Fp4Experts(
        stack("packed"),
        stack("scale_codes"),
        stack("multiplier").float(),
        first.group_size,
        first.e8m0,
        first.shape[1],
    )
    setattr(module, attr, None)
    return True
