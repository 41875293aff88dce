"""The checkpoint's recommended sampling (generation_config.json, or a GGUF's general.sampling.* keys): the
defaults of the sampling fields a request leaves out, as vLLM applies them (`--generation-config`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from engine.errors import NinferError
from engine.flag_json import json_object
from engine.request import LLAMA_CPP_FIELDS, SamplingParams

# the SamplingParams fields a generation_config.json may set (under the same names): vLLM's, then llama.cpp's
FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    *LLAMA_CPP_FIELDS,  # dry_sequence_breakers among them: a list of strings, the one that is not a number
    "thinking_budget",  # ninfer's: reasoning tokens before </think> (llama-server's --reasoning-budget N)
)
WHOLE_NUMBERS = (
    "top_k",
    "thinking_budget",
    *(name for name, kind in LLAMA_CPP_FIELDS.items() if kind is int),
)
# SamplingParams field <- GGUF key
GGUF_KEYS = {
    "temperature": "general.sampling.temp",
    "top_p": "general.sampling.top_p",
    "top_k": "general.sampling.top_k",
    "min_p": "general.sampling.min_p",
    "repetition_penalty": "general.sampling.penalty_repeat",
    "repeat_last_n": "general.sampling.penalty_last_n",
    "xtc_probability": "general.sampling.xtc_probability",
    "xtc_threshold": "general.sampling.xtc_threshold",
    "mirostat": "general.sampling.mirostat",
    "mirostat_tau": "general.sampling.mirostat_tau",
    "mirostat_eta": "general.sampling.mirostat_eta",
}


def from_generation_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields generation_config.json sets (numbers, whole where they count tokens; the DRY
    breakers a list of strings)."""
    out: dict[str, Any] = {}
    for name in FIELDS:
        value = cfg.get(name)
        if name == "dry_sequence_breakers":
            if isinstance(value, list) and all(isinstance(b, str) and b for b in value):
                out[name] = tuple(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = int(value) if name in WHOLE_NUMBERS else float(value)
    return out


def resolve(mode: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`--generation-config`: auto (the checkpoint's), none (ninfer's own defaults), or a
    generation_config.json file."""
    if mode == "auto":
        return dict(checkpoint)
    if mode == "none":
        return {}
    path = Path(mode).expanduser()
    if path.is_dir():
        path = path / "generation_config.json"
    if not path.is_file():
        raise NinferError(
            f"--generation-config {mode}: no such file; use auto (the checkpoint's), none, or a "
            "generation_config.json"
        )
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise NinferError(f"--generation-config {path} is not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise NinferError(f"--generation-config {path} must hold a JSON object")
    return from_generation_config(cfg)


def parse_overrides(value: Any) -> tuple[tuple[str, Any], ...]:
    """vLLM's `--override-generation-config`: a JSON object (or a dict) of sampling fields laid over the
    generation config's, e.g. {"temperature": 0.6, "top_k": 20}."""
    if value is None or value == ():
        return ()
    if isinstance(value, tuple):
        return value
    value = json_object(value, "--override-generation-config", '{"temperature": 0.6}')
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise NinferError(
            f"--override-generation-config sets {', '.join(unknown)}, which ninfer does not default; it takes "
            f"{', '.join(FIELDS)}"
        )
    fields = from_generation_config(value)
    bad = sorted(set(value) - set(fields))
    if bad:
        raise NinferError(
            f"--override-generation-config: {', '.join(bad)} must be numbers (dry_sequence_breakers: a list "
            "of strings)"
        )
    try:
        SamplingParams(**fields)
    except NinferError as e:
        raise NinferError(f"--override-generation-config: {e}") from None
    return tuple(fields.items())


def describe(defaults: dict[str, Any]) -> str:
    return ", ".join(f"{k} {_shown(v)}" for k, v in defaults.items()) or "none"


def _shown(value: Any) -> str:
    return json.dumps(list(value)) if isinstance(value, tuple) else f"{value:g}"
