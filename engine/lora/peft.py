"""A PEFT LoRA adapter (the folder `save_pretrained` writes) read into low-rank pairs of the model's layers.

A targeted projection W [out, in] becomes W + scale * B A, with A [r, in] (`lora_A`) and B [out, r]
(`lora_B`), scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora; alpha_pattern overrides per
module). The checkpoint names map through the model's own `param_for`, so a q_proj pair lands on the
fused qkv_proj's q rows (its shard) as the base weights do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.errors import NinferError
from engine.layers.linear import Linear, MergedLinear

PREFIX = "base_model.model."
PAIR_KEY = re.compile(r"(.+)\.lora_([AB])(?:\.default)?\.weight")


@dataclass(frozen=True)
class LoraPair:
    module: str  # the model's module name: model.layers.0.self_attn.qkv_proj
    rows: tuple[int, int]  # (start, size) of the module's outputs it adds to: a fused shard, or all of them
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [size, r], scale folded in


def read_adapter(name: str, path: str, model: torch.nn.Module) -> list[LoraPair]:
    """The adapter's pairs on `model`'s modules (fp32, on the host); NinferError naming what does not fit."""
    folder = Path(path)
    config = _config(name, folder)
    tensors = _tensors(name, folder)
    embedding = next((k for k in tensors if ".lora_embedding_" in k), None)
    if embedding is not None:
        target = embedding.split(".lora_embedding_")[0].removeprefix(PREFIX)
        raise _not_a_layer(name, target)
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = PAIR_KEY.fullmatch(key)
        if match is None:
            raise NinferError(
                f"LoRA adapter '{name}' holds {key}, which is not a LoRA matrix (a module saved whole: "
                "modules_to_save, or trained biases); ninfer applies lora_A / lora_B pairs only"
            )
        target = match.group(1).removeprefix(PREFIX)
        halves.setdefault(target, {})[match.group(2)] = tensor
    if not halves:
        raise NinferError(f"LoRA adapter '{name}' ({path}) holds no lora_A / lora_B matrices")
    base = config.get("base_model_name_or_path") or "its base model"
    return low_rank_pairs(name, halves, model, base, lambda target, r: _scale(config, target, r))


def low_rank_pairs(
    name: str, halves: dict[str, dict[str, torch.Tensor]], model, base: str, scale
) -> list[LoraPair]:
    """`halves`: per target (the checkpoint's module name, model.layers.0.self_attn.q_proj), its "A"
    [r, in] and "B" [out, r]; `scale(target, r)`: the factor B takes. Each checked against the model."""
    pairs = []
    for target, half in sorted(halves.items()):
        if set(half) != {"A", "B"}:
            raise NinferError(
                f"LoRA adapter '{name}': {target} has lora_{''.join(half)} without its other half"
            )
        module_name, rows, module = _module_of(name, target, model, base)
        a, b = half["A"].float(), half["B"].float()
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != r:
            raise NinferError(
                f"LoRA adapter '{name}': {target}'s lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are "
                "not a low-rank pair ([r, in] and [out, r])"
            )
        if a.shape[1] != module.in_features or b.shape[0] != rows[1]:
            raise NinferError(
                f"LoRA adapter '{name}': {target} maps {a.shape[1]} -> {b.shape[0]} features, but this model's "
                f"takes {module.in_features} -> {rows[1]}; the adapter was trained for {base}, not this model"
            )
        pairs.append(LoraPair(module_name, rows, a, b * scale(target, r)))
    return pairs


def _config(name: str, folder: Path) -> dict:
    file = folder / "adapter_config.json"
    if not file.is_file():
        raise NinferError(
            f"LoRA adapter '{name}': {folder} has no adapter_config.json; give the folder peft's "
            "save_pretrained wrote"
        )
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NinferError(f"LoRA adapter '{name}': {file} is not readable JSON ({e})") from e
    kind = config.get("peft_type", "LORA")
    if kind != "LORA":
        raise NinferError(f"adapter '{name}' is a {kind} adapter; ninfer runs LoRA adapters")
    unsupported = [
        ("use_dora", "DoRA (use_dora)"),
        ("fan_in_fan_out", "transposed matrices (fan_in_fan_out)"),
    ]
    for key, what in unsupported:
        if config.get(key):
            raise NinferError(f"LoRA adapter '{name}' uses {what}, which ninfer does not run")
    if config.get("bias", "none") != "none":
        raise NinferError(
            f"LoRA adapter '{name}' trains biases (bias: {config['bias']}); ninfer applies lora_A / lora_B "
            "pairs only"
        )
    return config


def _tensors(name: str, folder: Path) -> dict[str, torch.Tensor]:
    file = folder / "adapter_model.safetensors"
    if not file.is_file():
        pickled = (folder / "adapter_model.bin").is_file()
        raise NinferError(
            f"LoRA adapter '{name}': {folder} has no adapter_model.safetensors"
            + (
                " (it has adapter_model.bin, a pickle ninfer does not load; save it with "
                "save_pretrained(..., safe_serialization=True))"
                if pickled
                else ""
            )
        )
    try:
        return load_file(file)
    except (SafetensorError, OSError, ValueError) as e:
        raise NinferError(f"LoRA adapter '{name}': {file} is not a readable safetensors file ({e})") from e


def _module_of(name: str, target: str, model, base: str) -> tuple[str, tuple[int, int], Linear]:
    """(module name, output rows, module) of a PEFT target such as model.layers.0.self_attn.q_proj."""
    found = model.param_for(target + ".weight")
    module = None
    if found is not None and found[0].endswith(".weight"):
        module_name, shard = found[0][: -len(".weight")], found[1]
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            module = None
    if module is None and found is not None and not target.startswith(("mtp.", "model.visual.")):
        raise NinferError(
            f"LoRA adapter '{name}' changes {target}, which this model does not have; the adapter was "
            f"trained for {base}, not this model"
        )
    if (
        module is None
        or not isinstance(module, Linear)
        or module is getattr(model, "lm_head", None)
        or not module_name.startswith("model.layers.")
    ):
        raise _not_a_layer(name, target)
    if shard is None:
        return module_name, (0, module.out_features), module
    assert isinstance(module, MergedLinear), f"{module_name} takes shards but is not fused"
    return module_name, module.offsets[shard], module


def _not_a_layer(name: str, target: str) -> NinferError:
    return NinferError(
        f"LoRA adapter '{name}' changes {target}; ninfer applies LoRA to the decoder layers' linear "
        "projections (attention, MLP, linear attention), not to embeddings, the output head, experts or a "
        "vision tower"
    )


def _scale(config: dict, target: str, r: int) -> float:
    alpha = config.get("lora_alpha", r)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", target):
            alpha = value
            break
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
