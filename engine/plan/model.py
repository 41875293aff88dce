"""What `ninfer plan` plans for: a preset, a `.ninfer` artifact, an HF directory, a config.json or a GGUF
file, resolved to a config and weight bytes per kind."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats import stacked_experts
from engine.formats.dummy import FP4_GROUPS, checkpoint_tensors, fp4_split, is_dummy
from engine.formats.dummy import parse as parse_dummy
from engine.formats.hf_dir import checkpoint_shapes
from engine.formats.hf_fp4 import Fp4Scheme
from engine.formats.hf_intq import IntScheme
from engine.formats.hf_quant import checkpoint_quantization
from engine.formats.local_repo import looks_like_repo_id, resolve_repo_id
from engine.plan.presets import PRESETS, preset
from engine.plan.weights import (
    artifact_weight_bytes,
    fp4_checkpoint_weight_bytes,
    fp4_held_bytes,
    held_weight_bytes,
    int_checkpoint_weight_bytes,
    recipe_weight_bytes,
)
from engine.quant.recipes import stored_bits


@dataclass(frozen=True)
class PlannedModel:
    label: str
    config: ModelConfig
    weights: dict[str, int]
    recipe: str  # how the weights were counted
    serve_arg: str  # the MODEL argument of the printed serve line
    packed_weights: bool = False  # matrices kept 4/6/8-bit on the GPU (a quantized recipe or artifact)
    serve_flags: str = ""  # flags after MODEL in the serve line that hold the weights as counted
    prepare: str | None = None  # a command to run before the serve line (a conversion)


def resolve(
    model: str | None,
    preset_name: str | None,
    recipe: str | None,
    bits: float | None,
    mtp: bool,
    vision: bool,
    dtype_bytes: int = 2,
    mmproj: str | None = None,
) -> PlannedModel:
    """`mmproj`: a GGUF model's vision tower in llama.cpp's mmproj file (its shapes join the config)."""
    if model and preset_name:
        raise NinferError("pass either MODEL or --model PRESET, not both")
    if is_dummy(model):
        return _dummy(model, recipe, bits, mtp, vision, dtype_bytes)
    name = preset_name or (model if model and model.lower() in PRESETS and not Path(model).exists() else None)
    if name and mmproj:
        raise NinferError(f"the preset {name} counts its vision tower with --vision; drop --mmproj")
    if name and name.lower() == "default":  # the embedded GGUF, read from its file
        from engine.models.loader import default_model_path

        return _from_gguf(
            default_model_path(), "default", "<default artifact>", recipe, bits, mtp, vision, dtype_bytes
        )
    if name:
        p = preset(name)
        config = p.config
        how = recipe or p.recipe
        weights = recipe_weight_bytes(config, how, dtype_bytes, bits, mtp, vision)
        label, packed = _label(how, bits), _packed(how, bits)
        return PlannedModel(p.name, config, weights, label, f"<{p.name} artifact>", packed)
    if not model:
        raise NinferError(
            f"pass a MODEL (.ninfer, HF directory, config.json, .gguf) or --model PRESET ({', '.join(PRESETS)})"
        )
    path = Path(model).expanduser()
    if not path.exists() and looks_like_repo_id(model):  # a hub repo id: its download on this machine
        path = resolve_repo_id(model)
    if not path.exists():
        raise NinferError(
            f"{path} does not exist; pass a .ninfer file, an HF directory, a config.json, or --model PRESET"
        )
    if mmproj:
        from engine.formats.gguf_mmproj import check_gguf_model

        check_gguf_model(path)
    if path.suffix == ".ninfer":
        from engine.formats.container import model_config_from_json, read_header

        meta = read_header(path)["__metadata__"]
        config = model_config_from_json(meta["config"])
        if recipe or bits:
            weights = recipe_weight_bytes(config, recipe or "bf16", dtype_bytes, bits, mtp, vision)
            how, packed = _label(recipe or "bf16", bits), _packed(recipe or "bf16", bits)
        else:
            weights = artifact_weight_bytes(path, config, dtype_bytes, mtp, vision)
            how, packed = f"{meta.get('recipe', '?')} (as stored)", meta.get("recipe", "bf16") != "bf16"
        return PlannedModel(path.name, config, weights, how, str(path), packed)
    if path.is_dir() or path.name == "config.json":
        cfg_path = path / "config.json" if path.is_dir() else path
        if not cfg_path.is_file():
            raise NinferError(f"{path} has no config.json; pass an HF checkpoint directory")
        raw = json.loads(cfg_path.read_text())
        config = ModelConfig.from_hf_dict(raw)
        scheme = checkpoint_quantization(raw, str(path))
        serve_arg = str(cfg_path.parent)
        if scheme is not None and not (recipe or bits):
            weights, label, packed = _as_quantized(scheme, cfg_path, config, dtype_bytes, mtp, vision)
            return PlannedModel(path.name, config, weights, label, serve_arg, packed)
    elif path.suffix == ".gguf":
        return _from_gguf(path, path.name, str(path), recipe, bits, mtp, vision, dtype_bytes, mmproj)
    else:
        raise NinferError(
            f"cannot plan for {path.name}; pass a .ninfer file, an HF directory, a config.json or a .gguf"
        )
    how = recipe or "bf16"  # a checkpoint runs in the model dtype on a GPU unless converted
    weights = recipe_weight_bytes(config, how, dtype_bytes, bits, mtp, vision)
    planned = PlannedModel(path.name, config, weights, _label(how, bits), serve_arg, _packed(how, bits))
    return _held_as(planned, recipe, bits, scheme)


def _held_as(planned: PlannedModel, recipe: str | None, bits: float | None, scheme) -> PlannedModel:
    """A checkpoint directory planned at a recipe: the serve line that holds it so. w4g128 / w8g128 of a
    16-bit (or FP8) checkpoint: quantized as it loads (--weight-quant int4 / int8); bf16: as it is (an FP8
    one with --weight-quant none, which keeps it from 8 bits); another recipe, or a checkpoint quantized
    by AWQ / GPTQ: converted first, the artifact served. --bits alone names no recipe: the line serves the
    checkpoint as it is."""
    if recipe is None or bits is not None:
        return planned
    packed_already = isinstance(scheme, IntScheme)
    if recipe == "bf16" and not packed_already:
        return replace(planned, serve_flags=" --weight-quant none") if scheme is not None else planned
    if recipe in ("w4g128", "w8g128") and not packed_already:
        return replace(planned, serve_flags=f" --weight-quant int{recipe[1]}")
    artifact = f"{planned.serve_arg.rstrip('/')}-{recipe}.ninfer"
    command = f"ninfer convert {shlex.quote(planned.serve_arg)} {shlex.quote(artifact)} --recipe {recipe}"
    return replace(planned, serve_arg=artifact, prepare=command)


def _as_quantized(
    scheme, cfg_path: Path, config: ModelConfig, dtype_bytes: int, mtp: bool, vision: bool
) -> tuple[dict[str, int], str, bool]:
    """(weight bytes, label, held packed) of a checkpoint another tool quantized, as the loader holds it:
    FP8 / int8-a-tensor matrices quantized as they load into 8-bit groups of 128 (w8g128's bytes), NVFP4 /
    MXFP4 matrices as stored, 4- / 8-bit layers packed (counted from the headers of the config's folder; a
    config.json alone, estimated at the width)."""
    if isinstance(scheme, Fp4Scheme) and config.architecture != stacked_experts.ARCHITECTURE:
        try:
            shapes = checkpoint_shapes(cfg_path.parent)
        except NinferError:  # no weights beside the config.json: its matrices FP4 as the tools store them
            weights, _ = _fp4_of_shapes(config, scheme.group, dtype_bytes, mtp, vision)
            return weights, f"{scheme.label} (estimated from config.json)", True
        weights, experts = fp4_checkpoint_weight_bytes(shapes, scheme, config, dtype_bytes, mtp, vision)
        return weights, _fp4_label(scheme.label, experts), True
    if not isinstance(scheme, IntScheme):
        weights = recipe_weight_bytes(config, "w8g128", dtype_bytes, None, mtp, vision)
        return weights, f"{scheme.label} held as 8-bit groups of 128, quantized as it loads", True
    try:
        shapes = checkpoint_shapes(cfg_path.parent)
    except NinferError:  # no weights beside the config.json
        weights = recipe_weight_bytes(config, f"w{scheme.bits}g128", dtype_bytes, None, mtp, vision)
        return weights, f"{scheme.label} (estimated from config.json)", True
    weights = int_checkpoint_weight_bytes(shapes, scheme, config, dtype_bytes, mtp, vision)
    return weights, f"{scheme.label} (as stored)", True


def _dummy(
    model: str, recipe: str | None, bits: float | None, mtp: bool, vision: bool, dtype_bytes: int
) -> PlannedModel:
    """`dummy:SHAPE[:RECIPE]` (engine/formats/dummy.py): the shape's bytes at the recipe it loads with."""
    if recipe or bits:
        raise NinferError(f"{model} holds its weights as its recipe says; drop --recipe / --bits")
    shape, how = parse_dummy(model)
    if how.endswith("g32"):  # (plan's recipes are groups of 128: the same bits at the g32 bytes a weight)
        how, bits = f"{how[:2]}g128", stored_bits((int(how[1]), 32))
    if how in FP4_GROUPS:  # as the FP4 matrices of such a checkpoint are held (the rest 16-bit)
        return _dummy_fp4(model, shape, how, mtp, vision, dtype_bytes)
    is_preset = shape.lower() in PRESETS and not Path(shape).exists()
    planned = resolve(
        None if is_preset else shape, shape if is_preset else None, how, bits, mtp, vision, dtype_bytes
    )
    return replace(planned, label=model, serve_arg=model)


def _dummy_fp4(model: str, shape: str, how: str, mtp: bool, vision: bool, dtype_bytes: int) -> PlannedModel:
    """dummy:SHAPE:nvfp4 / mxfp4: the dummy's FP4 matrices (engine/formats/dummy.fp4_split) counted as the
    loader holds them, the rest in the model dtype."""
    is_preset = shape.lower() in PRESETS and not Path(shape).exists()
    planned = resolve(
        None if is_preset else shape, shape if is_preset else None, "bf16", None, mtp, vision, dtype_bytes
    )
    weights, experts = _fp4_of_shapes(planned.config, FP4_GROUPS[how], dtype_bytes, mtp, vision)
    label = _fp4_label(how, experts)
    return replace(planned, label=model, serve_arg=model, weights=weights, recipe=label, packed_weights=True)


def _fp4_of_shapes(
    config: ModelConfig, group: int, dtype_bytes: int, mtp: bool, vision: bool
) -> tuple[dict[str, int], bool]:
    """fp4_held_bytes of the config's shapes as FP4 checkpoints store them (engine/formats/dummy.fp4_split:
    the head and the embeddings 16-bit)."""
    fp4, dense = fp4_split(checkpoint_tensors(config))
    return fp4_held_bytes(list(fp4.items()), dense, group, config, dtype_bytes, mtp, vision)


def _fp4_label(name: str, experts_in_8_bits: bool) -> str:
    return f"{name} as stored" + (", experts as 8-bit groups of 128" if experts_in_8_bits else "")


def _from_gguf(
    path: Path,
    label: str,
    serve_arg: str,
    recipe: str | None,
    bits: float | None,
    mtp: bool,
    vision: bool,
    dtype_bytes: int,
    mmproj: str | None = None,
) -> PlannedModel:
    """A GGUF file: its block-quantized matrices stay packed on the GPU (engine/formats/gguf_blocks.py), so
    they count as held; a float GGUF, or one planned at a recipe, counts as a checkpoint does. With an
    mmproj, the tower counts from its shapes in the model dtype (it loads dequantized)."""
    from engine.formats.gguf import gpu_tensors

    config, tensors = gpu_tensors(path)
    if mmproj:
        from engine.formats.gguf_mmproj import tower_config

        config, _ = tower_config(config, path, mmproj)
    if any(held is not None for *_, held in tensors) and not (recipe or bits):
        weights = held_weight_bytes(tensors, config, dtype_bytes, mtp, vision)
        return PlannedModel(label, config, weights, "GGUF blocks as stored", serve_arg, True)
    how = recipe or "bf16"
    weights = recipe_weight_bytes(config, how, dtype_bytes, bits, mtp, vision)
    return PlannedModel(label, config, weights, _label(how, bits), serve_arg, _packed(how, bits))


def _label(recipe: str, bits: float | None) -> str:
    return f"{bits:g} bits/weight" if bits is not None else recipe


def _packed(recipe: str, bits: float | None) -> bool:
    return bits < 16 if bits is not None else recipe != "bf16"
