"""The `.ninfer` container: one safetensors file holding a converted model (docs/formats.md).

`__metadata__` (strings, as safetensors requires): format = "ninfer", container_version, config (JSON of
ModelConfig), tokenizer (JSON: the tokenizers backend, special tokens, chat template), recipe (the recipe
name), quant (JSON: per quantized tensor its bits, group size and shape), source (JSON: repo, revision,
file). A quantized tensor NAME is stored as NAME.qpacked, NAME.qscales and (4 and 6 bits) NAME.qmins.

The file is written in one streaming pass (tensor data to a side file, then header + data), so converting
never holds the whole model in memory; it is read through safetensors' mmap.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.safetensors_writer import DTYPES, header_bytes
from engine.formats.source import ModelSource, WeightIterator
from engine.quant.groupwise import QuantizedTensor, dequantize
from engine.tokenizer import Tokenizer

FORMAT = "ninfer"
CONTAINER_VERSION = 1
MIN_READ_VERSION, MAX_READ_VERSION = 1, 1
SUFFIX = ".ninfer"


def model_config_to_json(config: ModelConfig) -> str:
    return json.dumps({k: v for k, v in asdict(config).items() if k != "extra"})


def model_config_from_json(text: str) -> ModelConfig:
    data = json.loads(text)
    known = {f.name for f in fields(ModelConfig)}
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
    return ModelConfig(**data)


def tokenizer_to_json(tok: Tokenizer) -> str:
    return json.dumps(
        {
            "backend": tok.backend.to_str(),
            "chat_template": tok.chat_template,
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "pad_token": tok.pad_token,
            "unk_token": tok.unk_token,
            "add_bos_token": tok.add_bos_token,
            "extra_eos_token_ids": list(tok.extra_eos_token_ids),
            "sampling_defaults": tok.sampling_defaults,
        }
    )


def tokenizer_from_json(text: str) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    data = json.loads(text)
    return Tokenizer(
        backend=HFTokenizer.from_str(data["backend"]),
        chat_template=data.get("chat_template"),
        bos_token=data.get("bos_token"),
        eos_token=data.get("eos_token"),
        pad_token=data.get("pad_token"),
        unk_token=data.get("unk_token"),
        add_bos_token=bool(data.get("add_bos_token")),
        extra_eos_token_ids=tuple(data.get("extra_eos_token_ids") or ()),
        sampling_defaults=dict(data.get("sampling_defaults") or {}),
    )


def write_container(
    path: Path,
    config: ModelConfig,
    tokenizer: Tokenizer | None,
    tensors: Iterator[tuple[str, torch.Tensor | QuantizedTensor]],
    recipe: str,
    source: dict[str, Any],
) -> None:
    """Stream (name, tensor or QuantizedTensor) pairs into a .ninfer file at `path` (written atomically)."""
    path = Path(path)
    header: dict[str, Any] = {}
    quant: dict[str, Any] = {}
    offset = 0
    data_path = path.with_name(path.name + ".data.partial")
    with open(data_path, "wb") as data:

        def put(name: str, t: torch.Tensor) -> None:
            nonlocal offset
            t = t.detach().contiguous().cpu()
            raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            header[name] = {
                "dtype": DTYPES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + len(raw)],
            }
            data.write(raw)
            offset += len(raw)

        for name, t in tensors:
            if isinstance(t, QuantizedTensor):
                assert t.columns is None, f"{name}: a container stores a matrix's columns in order"
                quant[name] = {"bits": t.bits, "group_size": t.group_size, "shape": list(t.shape)}
                put(f"{name}.qpacked", t.packed)
                put(f"{name}.qscales", t.scales)
                if t.minimums is not None:
                    put(f"{name}.qmins", t.minimums)
            else:
                put(name, t)
    header["__metadata__"] = {
        "format": FORMAT,
        "container_version": str(CONTAINER_VERSION),
        "config": model_config_to_json(config),
        "tokenizer": tokenizer_to_json(tokenizer) if tokenizer is not None else "",
        "recipe": recipe,
        "quant": json.dumps(quant),
        "source": json.dumps(source),
    }
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as out, open(data_path, "rb") as data:
        out.write(header_bytes(header))
        while chunk := data.read(1 << 24):
            out.write(chunk)
    os.replace(tmp, path)
    data_path.unlink()


def read_header(path: Path) -> dict[str, Any]:
    """The safetensors header of `path`, telling a non-container and a corrupt file apart (NinferError).
    The same header bytes are parsed once (the loader and the planner each ask at start-up); read-only."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise NinferError(
                f"{path} is corrupt: {size} bytes is too short for a .ninfer container; download it again"
            )
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 1 << 30):
            raise NinferError(
                f"{path} is not a .ninfer container (no safetensors header); pass a .ninfer file, an HF "
                "checkpoint directory or a .gguf file"
            )
        try:
            header = _parse_header(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise NinferError(f"{path} is corrupt: its header does not parse ({e}); download it again") from e
    meta = header.get("__metadata__") or {}
    if meta.get("format") != FORMAT:
        raise NinferError(
            f"{path} is a safetensors file but not a .ninfer container (no format: ninfer in its metadata); "
            "pass its checkpoint directory, or make one with `ninfer convert`"
        )
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size < 8 + n + end:
        raise NinferError(
            f"{path} is corrupt: truncated to {size} bytes of the {8 + n + end} its header describes; download it again"
        )
    version = int(meta.get("container_version", "0"))
    if not MIN_READ_VERSION <= version <= MAX_READ_VERSION:
        if version > MAX_READ_VERSION:
            raise NinferError(
                f"this artifact is container v{version}; this ninfer reads v{MIN_READ_VERSION}–v{MAX_READ_VERSION} "
                f"— upgrade ninfer, or fetch a revision that holds a v{MAX_READ_VERSION} artifact "
                "(ninfer fetch --revision <commit>)"
            )
        raise NinferError(
            f"{path} is container v{version}, older than this ninfer reads; convert the model again"
        )
    return header


@functools.lru_cache(maxsize=4)
def _parse_header(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)


def load_container(path: Path) -> ModelSource:
    """A ModelSource over a .ninfer file. Quantized tensors are dequantized as they stream out (fp32)."""
    from safetensors import safe_open

    header = read_header(path)
    meta = header["__metadata__"]
    config = model_config_from_json(meta["config"])
    tokenizer = tokenizer_from_json(meta["tokenizer"]) if meta.get("tokenizer") else None
    quant = json.loads(meta.get("quant") or "{}")
    quant_parts = {f"{name}.{part}" for name in quant for part in ("qpacked", "qscales", "qmins")}

    def unquantized() -> WeightIterator:
        with safe_open(str(path), framework="pt") as f:
            for name in sorted(set(f.keys()) - quant_parts):
                yield name, f.get_tensor(name)

    def quantized() -> Iterator[tuple[str, QuantizedTensor]]:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            for name, q in quant.items():
                mins = f"{name}.qmins"
                yield (
                    name,
                    QuantizedTensor(
                        bits=q["bits"],
                        group_size=q["group_size"],
                        shape=tuple(q["shape"]),
                        packed=f.get_tensor(f"{name}.qpacked"),
                        scales=f.get_tensor(f"{name}.qscales"),
                        minimums=f.get_tensor(mins) if mins in keys else None,
                    ),
                )

    def weights() -> WeightIterator:
        yield from unquantized()
        for name, qt in quantized():
            yield name, dequantize(qt)

    tensor_bits = {name: q["bits"] for name, q in quant.items()}
    recipe = meta.get("recipe", "?")
    return ModelSource(
        config,
        tokenizer,
        weights,
        f"{path} (.ninfer {recipe}, {config.architecture})",
        tensor_bits,
        quantized_weights=quantized,
        unquantized_weights=unquantized,
    )
