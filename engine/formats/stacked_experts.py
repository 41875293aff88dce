"""Stacked experts read as the engine holds them (transformers' own layout): gate_up_proj [E, 2I, H] (gate
rows, then up rows), down_proj [E, H, I]. Qwen3-VL-MoE's published checkpoints store each transposed,
[E, H, 2I] and [E, I, H] (the original code multiplied the activations by them on the right); others (a
Qwen3.5-MoE checkpoint written with stacked experts) store them as held. Either is read, for every
mixture-of-experts architecture: a tensor is transposed where its shape is the transposed one and not the
held one (a square one, H = 2I or I = H, is taken as held, as transformers takes it)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.config import ModelConfig

ARCHITECTURE = "Qwen3VLMoeForConditionalGeneration"


def as_held(
    tensors: Iterator[tuple[str, torch.Tensor]], config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
    held = {".mlp.experts.gate_up_proj": (e, 2 * i, h), ".mlp.experts.down_proj": (e, h, i)}
    for name, tensor in tensors:
        shape = next((s for suffix, s in held.items() if name.endswith(suffix)), None)
        if (
            shape is not None
            and tuple(tensor.shape) != shape
            and tuple(tensor.shape) == (e, shape[2], shape[1])
        ):
            tensor = tensor.transpose(1, 2).contiguous()
        yield name, tensor


_STACKS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def per_expert(tensors: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Stacked experts as held ([E, 2I, H] / [E, H, I]) as each expert's matrices, named as a per-expert
    checkpoint names them (`...experts.{e}.gate_proj.weight`, `up_proj`, `down_proj`), which the engine
    loads into the same stack: what `ninfer convert` quantizes matrix by matrix. Other tensors pass."""
    for name, tensor in tensors:
        if not (name.endswith(_STACKS) and tensor.dim() == 3):
            yield name, tensor
            continue
        base, _, kind = name.rpartition(".")
        for e, matrix in enumerate(tensor):
            if kind == "down_proj":
                yield f"{base}.{e}.down_proj.weight", matrix
            else:
                rows = matrix.shape[0] // 2
                yield f"{base}.{e}.gate_proj.weight", matrix[:rows]
                yield f"{base}.{e}.up_proj.weight", matrix[rows:]
