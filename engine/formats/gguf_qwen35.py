"""Qwen3.5 in GGUF (llama.cpp's `qwen35` architecture): its metadata read into a ModelConfig, and what
llama.cpp's converter changed in the tensors undone, so that they load as the HF checkpoint's.

What the converter stores differently from the HF checkpoint:
- the (1 + w) RMSNorm weights (layer norms, q/k norms, the final norm) as 1 + w; the Gated DeltaNet's
  own gated norm as is;
- A_log as -exp(A_log) (`ssm_a`), dt_bias as `ssm_dt.bias`, the conv1d kernel [C, 1, K] as [C, K];
- where value heads outnumber key heads, every tensor that runs over value heads (the v rows of
  in_proj_qkv and the conv1d, in_proj_z / b / a rows, A_log, dt_bias, out_proj columns) in tiled order,
  value head j of key head i at j * num_k + i, where the checkpoint groups them (i * per_k + j);
- the multi-token-prediction head as extra blocks after the text layers (`{arch}.nextn_predict_layers`
  of them): `blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm}` for mtp.{fc, pre_fc_norm_embedding,
  pre_fc_norm_hidden, norm} (the norms stored as 1 + w too) and block N's own attention / MLP tensors for
  mtp.layers.{N - text layers}.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch

from engine.config import ModelConfig

# GGUF block tensor -> HF name inside a layer (attn_q/k/v/output, q/k norms and the MLP are Llama's names)
LAYER_NAMES = {
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "post_attention_norm": "post_attention_layernorm",
}
# GGUF tensors whose HF name is not the suffix-for-suffix rename (a parameter, not a module's weight)
PARAMETERS = {"ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias"}

_MTP_RE = re.compile(r"^blk\.(\d+)\.nextn\.")


def text_layers(tensor_names: Iterable[str], block_count: int) -> int:
    """The blocks before the first MTP block (the converter counts MTP layers in block_count)."""
    mtp = [int(m.group(1)) for n in tensor_names if (m := _MTP_RE.match(n))]
    return min(mtp, default=block_count)


# the MTP head's own tensors in an MTP block -> their HF names under mtp.
NEXTN_NAMES = {
    "nextn.eh_proj": "fc",
    "nextn.enorm": "pre_fc_norm_embedding",
    "nextn.hnorm": "pre_fc_norm_hidden",
    "nextn.shared_head_norm": "norm",
}


def config_fields(
    key: Callable[..., Any], head_dim: int, num_layers: int, mtp_layers: int = 0
) -> dict[str, Any]:
    """The ModelConfig fields of the hybrid layout, from the `qwen35.*` keys (`key` reads one);
    `mtp_layers`: the MTP blocks the file holds after the `num_layers` text layers."""
    interval = key("full_attention_interval", 4)
    num_v_heads = key("ssm.time_step_rank")
    return dict(
        architecture="Qwen3_5ForCausalLM",
        num_hidden_layers=num_layers,
        mtp_num_hidden_layers=min(mtp_layers, key("nextn_predict_layers", 0)),
        layer_types=tuple(
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
        ),
        partial_rotary_factor=key("rope.dimension_count", head_dim // 4) / head_dim,
        linear_num_key_heads=key("ssm.group_count"),
        linear_num_value_heads=num_v_heads,
        linear_key_head_dim=key("ssm.state_size"),
        linear_value_head_dim=key("ssm.inner_size") // num_v_heads,
        linear_conv_kernel_dim=key("ssm.conv_kernel"),
    )


def restore_values(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The converter's value changes undone: 1 + w norms, -exp(A_log)."""
    ones_plus = ("norm.weight", "norm_embedding.weight", "norm_hidden.weight")  # the MTP head's too
    if name.endswith(ones_plus) and not name.endswith("linear_attn.norm.weight"):
        return tensor - 1
    if name.endswith("linear_attn.A_log"):
        return torch.log(-tensor)
    return tensor


def value_head_order(name: str, config: ModelConfig) -> tuple[int, torch.Tensor] | None:
    """(dim, index): the checkpoint's tensor is the converter's `index_select(dim, index)`; None where the
    converter moved nothing (value heads as many as key heads, or a tensor that does not run over them)."""
    num_k = config.linear_num_key_heads
    per_k = config.linear_num_value_heads // num_k if num_k else 1
    if per_k == 1 or ".linear_attn." not in name:
        return None
    head_v = config.linear_value_head_dim
    value_dim = config.linear_num_value_heads * head_v
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        key_rows = 2 * num_k * config.linear_key_head_dim
        return 0, torch.cat([torch.arange(key_rows), key_rows + _grouped(value_dim, num_k, per_k, head_v)])
    if name.endswith("in_proj_z.weight"):
        return 0, _grouped(value_dim, num_k, per_k, head_v)
    if name.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
        return 0, _grouped(config.linear_num_value_heads, num_k, per_k, 1)
    if name.endswith("out_proj.weight"):
        return 1, _grouped(value_dim, num_k, per_k, head_v)
    return None


def _grouped(size: int, num_k: int, per_k: int, head_dim: int) -> torch.Tensor:
    """Positions of the value heads in grouped order [num_k, per_k, head_dim] read from tiled order
    [per_k, num_k, head_dim]."""
    return torch.arange(size).reshape(per_k, num_k, head_dim).transpose(0, 1).reshape(size)
