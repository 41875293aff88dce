"""`--lora NAME=PATH`: the adapters a server offers, as users write them (vLLM's `--lora-modules`); and
`--lora-default NAME[=SCALE]`: those a request runs with when it picks none (llama-server's `--lora`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from engine.errors import NinferError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*")


def lora_modules(value: Any) -> tuple[tuple[str, str], ...]:
    """(name, path) pairs from `NAME=PATH` strings (a bare PATH is named after its folder; vLLM's JSON
    objects too), a {name: path} mapping, or pairs; refused in a sentence when a name repeats or a path is no folder."""
    if isinstance(value, dict):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    elif isinstance(value, (str, Path)):
        pairs = [_pair(str(value))]
    else:
        pairs = [_pair(v) if isinstance(v, (str, Path)) else tuple(v) for v in value]
    seen: set[str] = set()
    for name, path in pairs:
        if not NAME.fullmatch(name):
            raise NinferError(
                f"LoRA adapter name '{name}' is not a model name a request can send; use letters, digits "
                "and . _ - : / @ + (NAME=PATH)"
            )
        if name in seen:
            raise NinferError(f"LoRA adapter name '{name}' is given twice; give each adapter its own name")
        seen.add(name)
        if not (Path(path).is_dir() or (path.endswith(".gguf") and Path(path).is_file())):
            raise NinferError(
                f"LoRA adapter '{name}': {path} is not a folder; give the folder peft's save_pretrained "
                "wrote (adapter_config.json and adapter_model.safetensors), or a LoRA adapter .gguf"
            )
    return tuple((name, str(path)) for name, path in pairs)


def lora_defaults(values: list[str] | tuple[str, ...], names: list[str]) -> dict[str, float]:
    """{name: scale} from `NAME[=SCALE]` strings (scale 1 when left out), each naming one of `names`."""
    out: dict[str, float] = {}
    for text in values:
        name, sep, scale_text = str(text).partition("=")
        try:
            scale = float(scale_text) if sep else 1.0
        except ValueError:
            scale = math.nan
        if not math.isfinite(scale):
            raise NinferError(f"--lora-default takes NAME or NAME=SCALE, the scale a number; got '{text}'")
        if name not in names:
            served = ", ".join(names) or "none: add --lora NAME=PATH"
            raise NinferError(f"--lora-default {name}: no such adapter; the adapters are: {served}")
        if name in out:
            raise NinferError(f"--lora-default names '{name}' twice; give each adapter one scale")
        out[name] = scale
    return out


def adapter_name(text: str) -> str:
    """The name `--lora` gives an adapter written as NAME=PATH, PATH, or vLLM's JSON form."""
    return _pair(text)[0]


def _pair(text: str) -> tuple[str, str]:
    text = str(text)
    if text.lstrip().startswith("{"):  # vLLM's JSON form: {"name": ..., "path": ..., "base_model_name": ...}
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as e:
            raise NinferError(f"--lora's JSON form is not valid JSON ({e}); or write NAME=PATH") from e
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry.get("path"):
            raise NinferError(f'--lora\'s JSON form takes {{"name": ..., "path": ...}}; got {text}')
        return entry["name"], str(entry["path"])
    name, sep, path = text.partition("=")
    if not sep:  # named after its folder, or its file without .gguf
        return Path(text).name.removesuffix(".gguf") or str(text), str(text)
    if not name or not path:
        raise NinferError(f"--lora takes NAME=PATH (or a PATH, named after its folder); got '{text}'")
    return name, path
