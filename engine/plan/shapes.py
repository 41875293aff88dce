"""Tensor shapes of a model without its weights: the engine's own modules built on the meta device, plus
the MTP head and the vision tower counted from the config."""

from __future__ import annotations

import torch

from engine.config import ModelConfig

Shape = tuple[int, ...]


def model_tensors(config: ModelConfig) -> list[tuple[str, Shape]]:
    """(name, shape) of every parameter the engine loads for this model (a tied head once, as the embedding)."""
    from engine.models.registry import model_class

    with torch.device("meta"):
        model = model_class(config)(config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def mtp_tensors(config: ModelConfig) -> list[tuple[str, Shape]]:
    """The multi-token-prediction head of each MTP layer: a full-attention decoder layer shaped like the
    model's own, fc [H, 2H] over [embedding | hidden], two pre-fc norms and a final norm."""
    full = next(i for i, t in enumerate(config.layer_types) if t == "full_attention")
    prefix = f"model.layers.{full}."
    layer = [(n[len(prefix) :], s) for n, s in model_tensors(config) if n.startswith(prefix)]
    h = config.hidden_size
    out: list[tuple[str, Shape]] = []
    for i in range(config.mtp_num_hidden_layers):
        out += [(f"mtp.layers.{i}.{n}", s) for n, s in layer]
        out += [(f"mtp.{i}.fc.weight", (h, 2 * h)), (f"mtp.{i}.pre_fc_norm_embedding.weight", (h,))]
        out += [(f"mtp.{i}.pre_fc_norm_hidden.weight", (h,)), (f"mtp.{i}.norm.weight", (h,))]
    return out


def vision_tensors(config: ModelConfig) -> list[tuple[str, Shape]]:
    """The vision tower of a Qwen3.5 / Qwen3-VL checkpoint (patch embedding, learned position table, ViT blocks
    with LayerNorm, and the patch merger(s) into the text hidden size)."""
    v = config.vision_config or {}
    if not v:
        return []
    hid, inter, depth = v["hidden_size"], v["intermediate_size"], v["depth"]
    patch = v.get("in_channels", 3) * v.get("temporal_patch_size", 2) * v.get("patch_size", 16) ** 2
    merged = hid * v.get("spatial_merge_size", 2) ** 2
    out_hidden = v.get("out_hidden_size", config.hidden_size)
    out: list[tuple[str, Shape]] = [
        ("visual.patch_embed.proj.weight", (hid, patch)),
        ("visual.patch_embed.proj.bias", (hid,)),
        ("visual.pos_embed.weight", (v.get("num_position_embeddings", 2304), hid)),
    ]
    for i in range(depth):
        b = f"visual.blocks.{i}."
        out += [(b + "norm1.weight", (hid,)), (b + "norm1.bias", (hid,))]
        out += [(b + "attn.qkv.weight", (3 * hid, hid)), (b + "attn.qkv.bias", (3 * hid,))]
        out += [(b + "attn.proj.weight", (hid, hid)), (b + "attn.proj.bias", (hid,))]
        out += [(b + "norm2.weight", (hid,)), (b + "norm2.bias", (hid,))]
        out += [(b + "mlp.linear_fc1.weight", (inter, hid)), (b + "mlp.linear_fc1.bias", (inter,))]
        out += [(b + "mlp.linear_fc2.weight", (hid, inter)), (b + "mlp.linear_fc2.bias", (hid,))]
    # the merger normalizes each patch; a deepstack merger (Qwen3-VL) the merged rows
    mergers = [("visual.merger.", hid)] + [
        (f"visual.deepstack_merger_list.{i}.", merged)
        for i in range(len(v.get("deepstack_visual_indexes") or []))
    ]
    for m, norm in mergers:
        out += [(m + "norm.weight", (norm,)), (m + "norm.bias", (norm,))]
        out += [(m + "linear_fc1.weight", (merged, merged)), (m + "linear_fc1.bias", (merged,))]
        out += [(m + "linear_fc2.weight", (out_hidden, merged)), (m + "linear_fc2.bias", (out_hidden,))]
    return out


def vision_patch_width(config: ModelConfig) -> tuple[int, int]:
    """(hidden_size, intermediate_size) of the vision tower, for its activation workspace."""
    v = config.vision_config or {}
    return v.get("hidden_size", 0), v.get("intermediate_size", 0)
