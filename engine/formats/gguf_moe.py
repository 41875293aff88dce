"""Mixture-of-experts GGUF files (llama.cpp's `qwen3moe` and `qwen35moe`): the expert keys read into a
ModelConfig, and the experts' stacked tensors split into the per-expert matrices the loader takes.

What the converter stores: a sparse layer's router as `ffn_gate_inp` [E, H]; every expert's gate, up and
down projections stacked, `ffn_{gate,up,down}_exps` [E, I, H] / [E, H, I] (or gate and up fused,
`ffn_gate_up_exps` [E, 2I, H]); Qwen3.5-MoE's shared expert as `ffn_{gate,up,down}_shexp` and its sigmoid
gate as `ffn_gate_inp_shexp`, a vector [H] where the checkpoint holds [1, H].
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

MOE_ARCHITECTURES = {
    "qwen3moe": "Qwen3MoeForCausalLM",
    "qwen3vlmoe": "Qwen3MoeForCausalLM",  # Qwen3-VL-MoE's text model: the converter stores qwen3moe's layout
    "qwen35moe": "Qwen3_5MoeForCausalLM",
    "qwen3next": "Qwen3NextForCausalLM",
}

# GGUF block tensor -> HF name inside a layer; the stacks' names are ours (split per expert below)
LAYER_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_stack",
    "ffn_up_exps": "mlp.experts.up_stack",
    "ffn_gate_up_exps": "mlp.experts.gate_up_stack",
    "ffn_down_exps": "mlp.experts.down_stack",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_STACK = re.compile(r"^(.*\.mlp\.experts)\.(gate|up|gate_up|down)_stack\.weight$")
_ROUTER = re.compile(r"^blk\.(\d+)\.ffn_gate_inp\.weight$")


def config_fields(
    key: Callable[..., Any], field: Callable[[str, Any], Any], tensor_names: set[str], num_layers: int
) -> dict[str, Any]:
    """The ModelConfig fields of the experts, from the `{arch}.expert_*` keys (`key` reads a required one,
    `field` an optional one); the layers without a router keep a dense MLP."""
    routed = {int(m.group(1)) for n in tensor_names if (m := _ROUTER.match(n))}
    moe = int(key("expert_feed_forward_length"))
    return dict(
        num_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        moe_intermediate_size=moe,
        # llama.cpp renormalises the chosen experts' weights for both architectures unless told otherwise
        norm_topk_prob=bool(field("expert_weights_norm", True)),
        mlp_only_layers=tuple(i for i in range(num_layers) if i not in routed),
        shared_expert_intermediate_size=int(field("expert_shared_feed_forward_length", 0) or 0),
        intermediate_size=int(field("feed_forward_length", moe) or moe),
    )


def is_stack(name: str) -> bool:
    return _STACK.match(name) is not None


def split_names(name: str, num_experts: int) -> list[list[tuple[str, str | None]]]:
    """Per expert, the (HF name, half of the expert's rows: "gate", "up" or None for all) it loads from."""
    base, kind = _STACK.match(name).groups()
    if kind != "gate_up":
        return [[(f"{base}.{e}.{kind}_proj.weight", None)] for e in range(num_experts)]
    return [
        [(f"{base}.{e}.gate_proj.weight", "gate"), (f"{base}.{e}.up_proj.weight", "up")]
        for e in range(num_experts)
    ]


def per_expert(name: str, stack: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A dense stack [E, N, K] as each expert's matrices (a fused gate | up stack as the two halves)."""
    for e, parts in enumerate(split_names(name, stack.shape[0])):
        matrix = stack[e]
        for expert_name, half in parts:
            yield expert_name, _half(matrix, half)


def _half(matrix, half: str | None):
    if half is None:
        return matrix
    rows = matrix.shape[0] // 2
    return matrix[:rows] if half == "gate" else matrix[rows:]


def expert_rows(name: str, data, num_experts: int) -> Iterator[tuple[str, Any]]:
    """A block-quantized stack's raw rows [E, N, row bytes] as each expert's [N', row bytes] (sliced as
    per_expert slices the dense stack: every row is whole blocks, so a slice of rows is a matrix)."""
    for e, parts in enumerate(split_names(name, num_experts)):
        for expert_name, half in parts:
            yield expert_name, _half(data[e], half)


def restore_shape(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The shared expert's gate, a vector in the file, is the checkpoint's [1, H] linear weight."""
    if name.endswith("mlp.shared_expert_gate.weight") and tensor.dim() == 1:
        return tensor.unsqueeze(0)
    return tensor
