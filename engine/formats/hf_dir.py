"""A Hugging Face checkpoint directory: config.json, safetensors shard(s), tokenizer files."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats import hf_fp4, hf_intq, hf_quant, qwen3_next, stacked_experts
from engine.formats.source import ModelSource, WeightIterator
from engine.tokenizer import Tokenizer

INDEX_FILE = "model.safetensors.index.json"


def check_safetensors_header(path: Path) -> list[str]:
    """Validate that the file holds a complete safetensors header and data; return its tensor names."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise NinferError(f"{path} is truncated ({size} bytes, no safetensors header); download it again")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise NinferError(
                f"{path} is truncated: its header needs {8 + header_len} bytes, the file has {size}; "
                "download it again"
            )
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise NinferError(
                f"{path} is not a valid safetensors file (bad header); download it again"
            ) from e
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise NinferError(
            f"{path} is truncated: it should hold {8 + header_len + end} bytes but has {size}; download it again"
        )
    return [k for k in header if k != "__metadata__"]


def shard_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        names = sorted(set(weight_map.values()))
        for name in names:
            if not (path / name).is_file():
                raise NinferError(
                    f"shard {path / name} is missing (listed in {INDEX_FILE}); download it again"
                )
        return [path / n for n in names]
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise NinferError(f"no *.safetensors weights in {path}; point ninfer at a complete checkpoint")
    return shards


def _reader(names: dict[Path, list[str]]) -> tuple[list[str], Callable[[str], torch.Tensor | None]]:
    """(every tensor name, shard by shard; read(name): that tensor, from whichever shard holds it, None where
    none does) over each shard's tensor names (check_safetensors_header's), each shard opened once."""
    where = {name: shard for shard, shard_names in names.items() for name in shard_names}
    handles: dict[Path, Any] = {}

    def read(name: str):
        if name not in where:
            return None
        shard = where[name]
        if shard not in handles:
            handles[shard] = safe_open(str(shard), framework="pt")
        return handles[shard].get_tensor(name)

    return list(where), read


def checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in an HF checkpoint directory, from its safetensors headers (no data read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in shard_files(path):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise NinferError(f"{file} is not valid JSON (line {e.lineno}); fix or re-download it") from e


# sentence-transformers' pooling modes (1_Pooling/config.json) and what to call them
_POOLING_MODES = {
    "pooling_mode_lasttoken": "last token",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_weightedmean_tokens": "weighted mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean / sqrt(length)",
}


def _pools_last_token(path: Path) -> bool:
    """Whether the directory is a sentence-transformers embedding model pooled by its last token (as
    Qwen3-Embedding ships); another pooling is refused in a sentence (ninfer pools by the last token
    only). False without a pooling config."""
    pooling = path / "1_Pooling" / "config.json"
    if not pooling.is_file():
        return False
    settings = _read_json(pooling)
    modes = [name for key, name in _POOLING_MODES.items() if settings.get(key)]
    if modes == ["last token"]:
        return True
    raise NinferError(
        f"{path} is an embedding model pooled by {' + '.join(modes) or 'no mode it names'}; ninfer pools by "
        "the last token only (Qwen3-Embedding)"
    )


def _is_qwen3_reranker(path: Path) -> bool:
    """Whether the model card titles the checkpoint a Qwen3-Reranker: a causal LM whose config says nothing
    of it, judged by its `yes` / `no` next token (as llama.cpp's converter recognises one)."""
    readme = path / "README.md"
    if not readme.is_file():
        return False
    lines = readme.read_text(errors="replace").splitlines()
    return any(
        line[2:].strip().lower().startswith("qwen3-reranker") for line in lines if line.startswith("# ")
    )


def config_json(path: Path) -> Path:
    """The checkpoint directory's config.json; NinferError when it has none."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise NinferError(
            f"{path} has no config.json; point ninfer at an HF checkpoint directory or a GGUF file"
        )
    return config_file


def load_hf_dir(path: Path) -> ModelSource:
    raw = _read_json(config_json(path))
    config = ModelConfig.from_hf_dict(raw)
    scheme = hf_quant.checkpoint_quantization(raw, str(path))
    preprocessor = path / "preprocessor_config.json"
    if config.vision_config and preprocessor.is_file():  # the vision tower's image preprocessing
        settings = _read_json(preprocessor)
        config = replace(config, vision_config={**config.vision_config, "preprocessor": settings})
    if _pools_last_token(path):
        config = replace(config, embedding_model=True)
    if not config.rerank and config.architecture == "Qwen3ForCausalLM" and _is_qwen3_reranker(path):
        config = replace(config, rerank="yes_no")
    shards = shard_files(path)
    names = {shard: check_safetensors_header(shard) for shard in shards}

    def stored() -> WeightIterator:
        for shard in shards:
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                    yield name, f.get_tensor(name)

    def arranged(tensors: WeightIterator) -> WeightIterator:
        """The tensors in the layout the engine holds (an architecture's own storage undone)."""
        if config.architecture == qwen3_next.ARCHITECTURE:  # read as Qwen3.5's layout
            return qwen3_next.as_qwen3_5(tensors, config)
        if config.num_experts:  # experts stored stacked, either way round (Qwen3-VL-MoE's transposed)
            return stacked_experts.as_held(tensors, config)
        return tensors

    description = f"{path} ({len(shards)} shard(s))"
    tokenizer = Tokenizer.from_hf_dir(path)
    if isinstance(scheme, hf_intq.IntScheme):  # its 4-bit layers kept as they are, the rest arranged
        return hf_intq.load(config, tokenizer, *_reader(names), scheme, description, arranged)

    def weights() -> WeightIterator:
        if isinstance(scheme, hf_quant.ScaledScheme):
            return arranged(hf_quant.dequantized(stored(), _reader(names)[1], scheme))
        if isinstance(scheme, hf_fp4.Fp4Scheme):
            return arranged(hf_fp4.dequantized(stored(), _reader(names)[1], scheme))
        return arranged(stored())

    if isinstance(scheme, hf_quant.ScaledScheme):  # dequantized as they stream
        return ModelSource(config, tokenizer, weights, f"{description}, {scheme.label}", stored_bits=8)
    if isinstance(scheme, hf_fp4.Fp4Scheme):  # so too, or held as stored where a GPU's kernels take them
        native = None
        if config.architecture != stacked_experts.ARCHITECTURE:  # (experts stored stacked: dequantized)
            native = hf_fp4.native_weights(*_reader(names), scheme, config, arranged)
        label = f"{description}, {scheme.label}"
        return ModelSource(config, tokenizer, weights, label, stored_bits=4, native_weights=native)
    return ModelSource(config, tokenizer, weights, description)
