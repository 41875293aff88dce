"""Qwen3-Next checkpoints read as Qwen3.5's: the same hybrid (Gated DeltaNet layers, gated full attention
every 4th layer, experts with a shared one, an MTP head), but each linear layer's input projections are
fused and interleaved per key-head group. `in_proj_qkvz` holds, for each of the Hk groups, the rows
[q (Dk) | k (Dk) | v (r * Dv) | z (r * Dv)] (r = Hv / Hk value heads a group); `in_proj_ba` holds
[b (r) | a (r)] a group. Split here into Qwen3.5's `in_proj_qkv` (every q row, then every k row, then every
v row: the conv's channel order, which Qwen3-Next's de-interleaving makes too), `in_proj_z`, `in_proj_b` and
`in_proj_a`, so that the loader, `ninfer convert` and the quantizers see one layout.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.config import ModelConfig
from engine.errors import NinferError

ARCHITECTURE = "Qwen3NextForCausalLM"
# llama.cpp's `qwen3next` GGUF: `ssm_ba` holds in_proj_ba as the checkpoint does; its converter splits
# in_proj_qkvz into attn_qkv | attn_gate as here, where an older file holds it whole as `ssm_in`
GGUF_FUSED = {"ssm_ba": "linear_attn.in_proj_ba", "ssm_in": "linear_attn.in_proj_qkvz"}
# a fused projection's HF name -> the names of its parts, in split_qkvz's / split_ba's order
PARTS = {
    "linear_attn.in_proj_qkvz": ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z"),
    "linear_attn.in_proj_ba": ("linear_attn.in_proj_b", "linear_attn.in_proj_a"),
}


def split_qkvz(weight: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[Hk * (2 Dk + 2 r Dv), H] -> in_proj_qkv [2 Hk Dk + Hv Dv, H], in_proj_z [Hv Dv, H]."""
    hk, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    r = config.linear_num_value_heads // hk
    groups = weight.reshape(hk, 2 * dk + 2 * r * dv, -1)  # [Hk, rows a group, H]
    q, k, v, z = groups.split([dk, dk, r * dv, r * dv], dim=1)
    qkv = torch.cat([part.reshape(-1, weight.shape[1]) for part in (q, k, v)])
    return qkv, z.reshape(-1, weight.shape[1])


def split_ba(weight: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[Hk * 2r, H] -> in_proj_b [Hv, H], in_proj_a [Hv, H]."""
    hk = config.linear_num_key_heads
    r = config.linear_num_value_heads // hk
    b, a = weight.reshape(hk, 2 * r, -1).split([r, r], dim=1)
    return b.reshape(-1, weight.shape[1]), a.reshape(-1, weight.shape[1])


SPLITS = {"linear_attn.in_proj_qkvz": split_qkvz, "linear_attn.in_proj_ba": split_ba}


def fused_projection(name: str) -> str | None:
    """The fused projection (a key of PARTS) a tensor name holds; None for every other tensor."""
    return next((fused for fused in PARTS if f".{fused}." in name), None)


def fused_parts(name: str, config: ModelConfig) -> list[tuple[str, torch.Tensor]] | None:
    """A Qwen3-Next checkpoint's fused projection weight `name` as Qwen3.5's layout holds it: each part's
    name with its rows of the fused matrix (int64); None for any other tensor or architecture (a quantized
    checkpoint's layers are split so, still packed: engine/formats/hf_intq.py, hf_fp4.py)."""
    fused = fused_projection(name) if config.architecture == ARCHITECTURE else None
    if fused is None:
        return None
    head = name.split(f".{fused}.")[0]
    return [(f"{head}.{part}.weight", rows) for part, rows in zip(PARTS[fused], part_rows(fused, config))]


def part_rows(fused: str, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a fused projection (a key of PARTS) each of its two parts is, in order: (int64 [rows of
    the first part], int64 [rows of the second])."""
    hk, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    hv = config.linear_num_value_heads
    rows = 2 * hk * dk + 2 * hv * dv if fused.endswith("qkvz") else 2 * hv
    first, second = SPLITS[fused](torch.arange(rows).unsqueeze(1), config)
    return first.squeeze(1), second.squeeze(1)


def as_qwen3_5(
    weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with the fused projections split (every other tensor as it is)."""
    for name, tensor in weights:
        fused = fused_projection(name)
        if fused is None:
            yield name, tensor
            continue
        prefix, suffix = name.split(f".{fused}.")
        if suffix != "weight":
            raise NinferError(
                f"{name}: a quantized layer's tensor, but the checkpoint's config.json names no quantization "
                "(quantization_config) to read it by; download the checkpoint again, with its config.json"
            )
        for part, weight in zip(PARTS[fused], SPLITS[fused](tensor, config)):
            yield f"{prefix}.{part}.weight", weight
