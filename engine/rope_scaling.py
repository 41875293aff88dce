"""RoPE scaling: the `--rope-scaling` flag, YaRN's frequencies and attention factor, and how many positions a
scaled model takes.

YaRN (arXiv 2309.00071) stretches a model trained on `original_max_position_embeddings` positions to
`factor` times as many: the rotary frequencies that turn fewer than `beta_slow` times over the original
context are interpolated (divided by `factor`), those that turn more than `beta_fast` times are kept, a
linear ramp blends the ones between, and cos / sin are multiplied by an attention factor
(0.1 ln(factor) + 1 by default) that sharpens the softmax the stretch flattens. Qwen3's dense and MoE
checkpoints take 32K positions natively and 128K with YaRN factor 4 (their model cards' recipe)."""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from engine.errors import NinferError
from engine.sizes import parse_size

# what the flag and a config.json may name; llama3 and GGUF frequency factors come with their checkpoints
SCALING_TYPES = ("default", "linear", "llama3", "yarn", "freq_factors")
_FLAG_FORMS = (
    "yarn:FACTOR, yarn:FACTOR:ORIGINAL_CONTEXT, none, or a JSON object like a config.json's rope_scaling"
)


def parse_rope_scaling(text: str) -> dict[str, Any] | None:
    """The `--rope-scaling` flag as a rope_scaling dict; None for `none` (the checkpoint's positions
    unscaled). NinferError in one sentence for anything else."""
    text = text.strip()
    if text.lower() in ("none", "default"):
        return None
    if text.startswith("{"):
        try:
            scaling = json.loads(text)
        except json.JSONDecodeError as e:
            raise NinferError(f"--rope-scaling is not valid JSON ({e.msg} at column {e.colno})") from None
        check_rope_scaling(scaling, "--rope-scaling")
        return None if _kind(scaling) == "default" else scaling
    kind, _, rest = text.partition(":")
    if kind.lower() != "yarn" or not rest:
        raise NinferError(f"--rope-scaling '{text}' is not understood; use {_FLAG_FORMS}")
    parts = rest.split(":")
    if len(parts) > 2:
        raise NinferError(f"--rope-scaling '{text}' has too many parts; use yarn:FACTOR[:ORIGINAL_CONTEXT]")
    try:
        factor = float(parts[0])
        original = parse_size(parts[1], "the original context") if len(parts) == 2 else None
    except (ValueError, NinferError):
        raise NinferError(
            f"--rope-scaling '{text}': the factor is a number (e.g. 4) and the original context a size "
            "(e.g. 32768 or 32k)"
        ) from None
    scaling: dict[str, Any] = {"rope_type": "yarn", "factor": factor}
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    check_rope_scaling(scaling, "--rope-scaling")
    return scaling


def _kind(scaling: dict[str, Any]) -> str:
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def check_rope_scaling(scaling: dict[str, Any], where: str) -> None:
    """A rope_scaling dict ninfer can run, or NinferError naming what is wrong (`where`: the flag or file)."""
    kind = _kind(scaling)
    if kind not in SCALING_TYPES:
        raise NinferError(
            f"{where}: rope scaling '{kind}' is not supported; supported: yarn, linear, llama3 (and GGUF "
            "rope_freqs)"
        )
    if kind in ("linear", "yarn", "llama3"):
        factor = scaling.get("factor")
        if not _number(factor) or not factor >= 1:
            raise NinferError(f"{where}: the {kind} factor must be a number >= 1 (got {factor!r})")
    if kind == "llama3":
        needed = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [key for key in needed if not _number(scaling.get(key))]
        if missing:
            raise NinferError(f"{where}: llama3 rope scaling needs {', '.join(missing)} (numbers)")
    if kind == "freq_factors" and not (
        isinstance(scaling.get("factors"), list) and all(_number(f) for f in scaling["factors"])
    ):
        raise NinferError(f"{where}: freq_factors rope scaling needs 'factors', a list of numbers")
    if kind == "yarn":
        original = scaling.get("original_max_position_embeddings")
        if original is not None and (
            isinstance(original, bool) or not isinstance(original, int) or original < 1
        ):
            raise NinferError(
                f"{where}: original_max_position_embeddings must be a positive whole number (got {original!r})"
            )
        for key in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
            value = scaling.get(key)
            if value is not None and (not _number(value) or value < 0):
                raise NinferError(f"{where}: yarn's {key} must be a number >= 0 (got {value!r})")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def with_defaults(scaling: dict[str, Any] | None, max_position_embeddings: int) -> dict[str, Any] | None:
    """YaRN without an original context stretches the checkpoint's own positions (as transformers and
    llama.cpp take it)."""
    if scaling is None or _kind(scaling) != "yarn" or "original_max_position_embeddings" in scaling:
        return scaling
    return {**scaling, "original_max_position_embeddings": max_position_embeddings}


def position_limit(scaling: dict[str, Any] | None, max_position_embeddings: int) -> int:
    """The positions a model takes: its max_position_embeddings, or original x factor under YaRN when that
    is more (vLLM's rule)."""
    if scaling is None or _kind(scaling) != "yarn":
        return max_position_embeddings
    original = scaling.get("original_max_position_embeddings", max_position_embeddings)
    return max(max_position_embeddings, int(original * scaling["factor"]))


def yarn_factor_for(context: int, max_position_embeddings: int) -> int:
    """The smallest whole YaRN factor that stretches `max_position_embeddings` positions to `context`."""
    return max(2, math.ceil(context / max_position_embeddings))


def yarn_inv_freq(scaling: dict[str, Any], rope_theta: float, dim: int) -> torch.Tensor:
    """[dim / 2] fp32 YaRN inverse frequencies: interpolated below beta_slow turns over the original
    context, kept above beta_fast, a linear blend between (correction range floored / ceiled unless
    `truncate` is false)."""
    factor = float(scaling["factor"])
    original = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def dim_turning(turns: float) -> float:  # the rotary dimension that turns `turns` times over `original`
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(rope_theta))

    low, high = dim_turning(beta_fast), dim_turning(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(
        0, 1
    )  # 0: keep, 1: stretch
    base = rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    kept, stretched = 1.0 / base, 1.0 / (factor * base)
    return kept * (1 - ramp) + stretched * ramp


def attention_factor(scaling: dict[str, Any] | None) -> float:
    """What cos / sin are multiplied by: YaRN's attention factor (given, or from factor and mscale);
    1 for every other scaling."""
    if scaling is None or _kind(scaling) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)


def positions_phrase(scaling: dict[str, Any] | None, max_position_embeddings: int) -> str:
    """'40960 positions (max_position_embeddings)', or '131072 positions (YaRN x4 over 32768)'."""
    limit = position_limit(scaling, max_position_embeddings)
    if limit == max_position_embeddings:
        return f"{limit} positions (max_position_embeddings)"
    original = scaling.get("original_max_position_embeddings", max_position_embeddings)  # type: ignore[union-attr]
    return f"{limit} positions (YaRN x{scaling['factor']:g} over {original})"  # type: ignore[index]


def stretch_hint(context: int, scaling: dict[str, Any] | None, max_position_embeddings: int) -> str:
    """', or stretch them with YaRN: --rope-scaling yarn:F' for a model that is not stretched yet."""
    if scaling is not None and _kind(scaling) == "yarn":
        return ""
    factor = yarn_factor_for(context, max_position_embeddings)
    return f", or stretch them with YaRN: --rope-scaling yarn:{factor}"
