"""llama.cpp's mmproj GGUF: the vision tower of a Qwen3.5 / Qwen3-VL GGUF model, in a file of its own
(`llama-server -m MODEL.gguf --mmproj mmproj.gguf`; here `--mmproj`).

What llama.cpp's converter writes for these towers (projector type `qwen3vl_merger`): the shapes as
`clip.vision.*` keys (blocks, widths, heads, the text model's width as the projection, patch and image
size, the merge size, which blocks feed a deepstack level) and the preprocessor's mean and std; the tensors
renamed (`v.blk.N.attn_qkv`, `v.post_ln`, `mm.0` / `mm.2` for the merger, `v.deepstack.N.*` numbered by the
block they follow) and the Conv3d patch kernel cut along time into two Conv2d kernels (`v.patch_embd.weight`
and `.weight.1`). `with_mmproj` turns that back into transformers' `vision_config` and tensor names
(`model.visual.*`), so the tower loads as a multimodal HF checkpoint's does. What the mmproj lacks comes from
the text GGUF: the M-RoPE sections (`{arch}.rope.dimension_sections`) and the placeholder token ids, found
by their spelling in its vocabulary.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.source import ModelSource, WeightIterator

PROJECTORS = ("qwen3vl_merger",)
# text architectures whose positions are interleaved M-RoPE (llama.cpp's "imrope"): the ones a
# qwen3vl_merger tower feeds
MROPE_ARCHITECTURES = ("qwen35", "qwen35moe", "qwen3vl", "qwen3vlmoe")
PLACEHOLDERS = {
    "image_token_id": "<|image_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}
# mmproj tensor (less .weight / .bias) -> the tower's HF module
_TOWER = {
    "v.patch_embd": "patch_embed.proj",
    "v.position_embd": "pos_embed",
    "v.post_ln": "merger.norm",
    "mm.0": "merger.linear_fc1",
    "mm.2": "merger.linear_fc2",
}
_BLOCK = {
    "ln1": "norm1",
    "ln2": "norm2",
    "attn_qkv": "attn.qkv",
    "attn_out": "attn.proj",
    "ffn_up": "mlp.linear_fc1",
    "ffn_down": "mlp.linear_fc2",
}
_DEEPSTACK = {"norm": "norm", "fc1": "linear_fc1", "fc2": "linear_fc2"}
_PATCH_TIME = "v.patch_embd.weight.1"  # the second frame's half of the Conv3d kernel


def with_mmproj(source: ModelSource, model_path: Path, mmproj_path: str | Path) -> ModelSource:
    """`source` (the text GGUF at `model_path`) with the vision tower of the mmproj file: its config gains
    a `vision_config` and M-RoPE sections, its weights the tower's tensors under `model.visual.*`."""
    config, reader = tower_config(source.config, model_path, mmproj_path)
    deepstack = config.vision_config["deepstack_visual_indexes"]

    def tower() -> WeightIterator:
        return tower_weights(reader, deepstack)

    unquantized = source.unquantized_weights
    return replace(
        source,
        config=config,
        weights=lambda: chain(source.weights(), tower()),
        unquantized_weights=None if unquantized is None else lambda: chain(unquantized(), tower()),
        description=f"{source.description} + vision tower {Path(mmproj_path).name}",
    )


def tower_config(config: ModelConfig, model_path: Path, mmproj_path: str | Path) -> tuple[ModelConfig, Any]:
    """(`config` of the text GGUF at `model_path` with the mmproj's vision_config and the M-RoPE sections,
    the mmproj's parsed header); every mismatch refused in one line."""
    from engine.formats import gguf

    mmproj_path = Path(mmproj_path).expanduser()
    check_gguf_model(model_path)
    if not mmproj_path.is_file():
        raise NinferError(f"{mmproj_path} does not exist; pass the mmproj-*.gguf published beside the model")
    reader = gguf._open(mmproj_path)
    text = gguf._open(model_path)
    vision = vision_config(reader, mmproj_path, config.hidden_size)
    arch = gguf._field(text, "general.architecture")
    if arch not in MROPE_ARCHITECTURES:
        raise NinferError(
            f"{mmproj_path.name} is a Qwen3.5 / Qwen3-VL vision tower, but {model_path.name} is a '{arch}' "
            f"model, whose positions have no image axes; use it with a GGUF of {', '.join(MROPE_ARCHITECTURES)}"
        )
    sections = [int(s) for s in gguf._field(text, f"{arch}.rope.dimension_sections") or ()]
    sections = tuple(sections[:3])  # the converter pads transformers' three sections with a zero
    if not any(sections):
        raise NinferError(
            f"{model_path.name} lacks {arch}.rope.dimension_sections (the M-RoPE sections image positions "
            "need); it was converted by an older llama.cpp: convert the model again, or serve its HF checkpoint"
        )
    vision.update(placeholder_ids(gguf._field(text, "tokenizer.ggml.tokens") or [], model_path))
    return replace(config, vision_config=vision, mrope_section=sections, mrope_interleaved=True), reader


def check_gguf_model(model_path: Path) -> None:
    """An mmproj goes with a GGUF model; the other formats carry their tower."""
    if model_path.suffix != ".gguf":
        raise NinferError(
            f"--mmproj holds the vision tower of a GGUF model, and {model_path.name} is not one; an HF "
            "checkpoint or a .ninfer carries its own tower: drop --mmproj and pass --vision"
        )


def vision_config(reader, path: Path, text_hidden: int) -> dict[str, Any]:
    """transformers' vision_config (with the preprocessor's settings) from the mmproj's clip keys."""
    from engine.formats.gguf import _field

    arch = _field(reader, "general.architecture")
    if arch != "clip":
        raise NinferError(
            f"{path.name} is not an mmproj file (its architecture is '{arch}', not clip); pass the "
            "mmproj-*.gguf published beside the model"
        )
    projector = _field(reader, "clip.vision.projector_type") or _field(reader, "clip.projector_type")
    if not _field(reader, "clip.has_vision_encoder", False) or projector not in PROJECTORS:
        raise NinferError(
            f"{path.name} holds a '{projector}' projector; ninfer runs the Qwen3.5 / Qwen3-VL vision tower "
            f"({', '.join(PROJECTORS)}) only"
        )

    def key(name: str) -> Any:
        value = _field(reader, f"clip.vision.{name}")
        if value is None:
            raise NinferError(f"{path.name} lacks the key clip.vision.{name}; the file is incomplete")
        return value

    out_hidden = int(key("projection_dim"))
    if out_hidden != text_hidden:
        raise NinferError(
            f"{path.name} projects images to {out_hidden} wide embeddings, but the model's are {text_hidden} "
            "wide: the mmproj belongs to another model; pass the one published beside it"
        )
    tensors = {t.name: t for t in reader.tensors}
    for name in ("v.position_embd.weight", "v.patch_embd.weight"):
        if name not in tensors:
            raise NinferError(f"{path.name} has no {name} tensor; the file is incomplete")
    depth = int(key("block_count"))
    flags = _field(reader, "clip.vision.is_deepstack_layers") or []
    preprocessor: dict[str, Any] = {
        "image_mean": [float(x) for x in key("image_mean")],
        "image_std": [float(x) for x in key("image_std")],
    }
    for field, name in (("min_pixels", "image_min_pixels"), ("max_pixels", "image_max_pixels")):
        if (value := _field(reader, f"clip.vision.{name}")) is not None:
            preprocessor[field] = int(value)
    return {
        "depth": depth,
        "hidden_size": int(key("embedding_length")),
        "intermediate_size": int(key("feed_forward_length")),
        "num_heads": int(key("attention.head_count")),
        "out_hidden_size": out_hidden,
        "patch_size": int(key("patch_size")),
        "temporal_patch_size": 2 if _PATCH_TIME in tensors else 1,
        "spatial_merge_size": int(_field(reader, "clip.vision.spatial_merge_size", 2)),
        # the learned position grid's rows, as stored (clip.vision.image_size is its side in pixels)
        "num_position_embeddings": int(tensors["v.position_embd.weight"].shape[1]),
        "deepstack_visual_indexes": [i for i, flag in enumerate(flags[:depth]) if flag],
        "preprocessor": preprocessor,
    }


def placeholder_ids(tokens: list[str], model_path: Path) -> dict[str, int]:
    """The image placeholder and the vision start / end token ids, by their spelling in the vocabulary."""
    index = {t: i for i, t in enumerate(tokens) if t.startswith("<|")}
    missing = [spelling for spelling in PLACEHOLDERS.values() if spelling not in index]
    if missing:
        raise NinferError(
            f"{model_path.name}'s vocabulary has no {', '.join(missing)} token, which image prompts need; "
            "the mmproj goes with a Qwen3.5 or Qwen3-VL GGUF"
        )
    return {field: index[spelling] for field, spelling in PLACEHOLDERS.items()}


def hf_name(name: str, deepstack: list[int]) -> str | None:
    """The tower tensor's HF name (`model.visual.*`); None for tensors the tower does not read."""
    module, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    parts = module.split(".")
    if module in _TOWER:
        return f"model.visual.{_TOWER[module]}.{suffix}"
    if len(parts) == 4 and parts[:2] == ["v", "blk"] and parts[3] in _BLOCK:
        return f"model.visual.blocks.{int(parts[2])}.{_BLOCK[parts[3]]}.{suffix}"
    if len(parts) == 4 and parts[:2] == ["v", "deepstack"] and parts[3] in _DEEPSTACK:
        block = int(parts[2])  # the converter numbers a level by the block it follows
        if block in deepstack:
            return (
                f"model.visual.deepstack_merger_list.{deepstack.index(block)}.{_DEEPSTACK[parts[3]]}.{suffix}"
            )
    return None


def tower_weights(reader, deepstack: list[int]) -> WeightIterator:
    """(HF name, fp32 tensor) of each tower tensor; the patch kernel's two frames stacked back along time
    ([hidden, C, T, P, P], the checkpoint's Conv3d)."""
    tensors = {t.name: t for t in reader.tensors}
    for name, t in tensors.items():
        if name == _PATCH_TIME:
            continue
        hf = hf_name(name, deepstack)
        if hf is None:
            continue
        tensor = _dense(t)
        if name == "v.patch_embd.weight":
            frames = [tensor] + ([_dense(tensors[_PATCH_TIME])] if _PATCH_TIME in tensors else [])
            tensor = torch.stack(frames, dim=2)
        yield hf, tensor


def _dense(t) -> torch.Tensor:
    """A tensor of the file in fp32, shaped in torch order (GGUF lists the fastest dimension first)."""
    import gguf

    values = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    return torch.from_numpy(values).reshape(tuple(int(d) for d in reversed(t.shape)))
