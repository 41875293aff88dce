"""Ollama's discovery routes, for the clients that find models the Ollama way and then talk OpenAI at
`/v1` on the same base URL (GitHub Copilot Chat's Ollama provider, and others): `GET /api/version`,
`GET /api/tags` (the served model and its LoRA adapters), `POST /api/show` (capabilities, context length,
chat template, details), `GET /api/ps` (what is loaded: nothing while asleep, and until when). Ollama's own chat, generate and embed routes are
engine/api/ollama_chat.py's. Errors: Ollama's `{"error"}`.
"""

from __future__ import annotations

import json
import math
import weakref
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from engine.api.common import read_json
from engine.api.errors import ApiError
from engine.api.ollama_keep_alive import expires_at
from engine.api.state import ServerState
from engine.config import ModelConfig
from engine.fim import fim_tokens

router = APIRouter()
# the Ollama API these routes answer as: Copilot Chat's provider asks for 0.6.4 or later
OLLAMA_API_VERSION = "0.12.0"
FORMATS = {".gguf": "gguf", ".ninfer": "ninfer"}


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION}


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.ninfer
    return {"models": [_entry(state, name) for name in _names(state)]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.ninfer
    llm = state.engine.llm
    if llm.sleep_level:  # asleep: unloaded, as Ollama lists it (the next request loads it)
        return {"models": []}
    on_gpu = llm.engine_config.device.startswith("cuda")
    loaded = []
    for name in _names(state):
        entry = _entry(state, name)
        loaded.append(
            {
                **entry,
                "size_vram": entry["size"] if on_gpu else 0,
                "context_length": state.max_context,
                "expires_at": expires_at(state),
            }
        )
    return {"models": loaded}


@router.post("/api/show")
async def show(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'model' is required: the name /api/tags lists", "model")
    name = name.removesuffix(":latest")  # Ollama's clients add the default tag to a bare name
    if name not in _names(state):
        served = ", ".join(f"'{m}'" for m in _names(state))
        raise ApiError(404, f"model '{name}' not found; this server serves {served}", "model")
    llm, tok = state.engine.llm, state.engine.tokenizer
    config = llm.model_config
    arch = _architecture(config)
    template = (tok.chat_template or "") if tok is not None else ""
    entry = _entry(state, name)
    return {
        "modelfile": "",
        "parameters": "",
        "template": template,
        "details": entry["details"],
        "model_info": {
            "general.architecture": arch,
            "general.basename": name,
            "general.parameter_count": _parameter_count(llm),
            f"{arch}.context_length": state.max_context,
            f"{arch}.embedding_length": config.hidden_size,
            f"{arch}.block_count": config.num_hidden_layers,
        },
        "capabilities": _capabilities(state, template),
        "modified_at": entry["modified_at"],
    }


def _names(state: ServerState) -> list[str]:
    return [state.model_id, *state.engine.llm.adapters.names]


def _entry(state: ServerState, name: str) -> dict[str, Any]:
    """One model as /api/tags lists it: its files' size and time, and its details."""
    llm = state.engine.llm
    path = _model_file(llm)
    size, modified = _files(str(path)) if path.exists() else (0, state.started)
    config = llm.model_config
    details = {
        "parent_model": state.model_id if name != state.model_id else "",
        "format": FORMATS.get(path.suffix, "safetensors"),
        "family": _architecture(config),
        "families": [_architecture(config)],
        "parameter_size": _parameter_size(_parameter_count(llm)),
        "quantization_level": _quantization(llm),
    }
    when = datetime.fromtimestamp(modified, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": when, "size": size, "details": details}


def _model_file(llm) -> Path:
    """The served model's file or folder (the embedded default's when none was named)."""
    from engine.models.loader import model_path

    return model_path(llm.engine_config.model or None)


@lru_cache(maxsize=4)
def _files(path: str) -> tuple[int, float]:
    """(bytes, newest modification time) of the model's file, or of a checkpoint folder's files."""
    p = Path(path)
    if not p.exists():  # dummy:SHAPE[:RECIPE] (random weights): no file
        return 0, 0.0
    files = [f for f in p.iterdir() if f.is_file()] if p.is_dir() else [p]
    stats = [f.stat() for f in files] or [p.stat()]
    return sum(s.st_size for s in stats), max(s.st_mtime for s in stats)


def _architecture(config: ModelConfig) -> str:
    return {"qwen3_5": "qwen35", "qwen3": "qwen3moe" if config.num_experts else "qwen3"}.get(
        config.family, config.family
    )


_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> its count, while it lives


def _parameter_count(llm) -> int:
    """The text model's parameters, from its config's shapes (packed weights hold no parameters); counted
    once an engine, without keeping the engine alive."""
    if llm not in _COUNTS:
        from engine.plan.shapes import model_tensors

        _COUNTS[llm] = sum(math.prod(shape) for _, shape in model_tensors(llm.model_config))
    return _COUNTS[llm]


def _parameter_size(count: int) -> str:
    """Ollama's rounded label: 135.0M, 8.2B."""
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def _quantization(llm) -> str:
    """What the weights are held as: quantized as they loaded (W4G128, W8G128), the GGUF's file type, the
    .ninfer's recipe, a checkpoint's quantization (AWQ_4-BIT, GPTQ_8-BIT, ...), else the dtype."""
    if getattr(llm, "quantized_at_load", None):
        return llm.quantized_at_load
    model = str(_model_file(llm))
    if model.endswith(".gguf"):
        import gguf

        from engine.formats.gguf import _field, _open

        file_type = _field(_open(Path(model)), "general.file_type")
        if file_type is not None:
            try:
                return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
            except ValueError:
                pass
    if model.endswith(".ninfer"):
        from engine.formats.container import read_header

        return str(read_header(Path(model))["__metadata__"].get("recipe", "?")).upper()
    config = Path(model) / "config.json"
    if config.is_file():
        from engine.formats.hf_quant import checkpoint_quantization

        scheme = checkpoint_quantization(json.loads(config.read_text()), model)
        if scheme is not None:
            return scheme.label.upper().replace(" ", "_")
    return str(llm.engine_config.torch_dtype).removeprefix("torch.").upper().replace("FLOAT", "F")


def _capabilities(state: ServerState, template: str) -> list[str]:
    """What the model does, in Ollama's words: completion (or embedding), tools and thinking where the
    chat template writes them, vision with the tower loaded, insert with fill-in-the-middle tokens."""
    llm = state.engine.llm
    if llm.text_refusal:
        return ["embedding"]
    out = ["completion"]
    if "tools" in template:
        out.append("tools")
    if "<think>" in template or "enable_thinking" in template:
        out.append("thinking")
    if llm.model.visual is not None:
        out.append("vision")
    if fim_tokens(state.engine.tokenizer) is not None:
        out.append("insert")
    return out
