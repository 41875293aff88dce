"""llama-server's `GET /props`: what the server is and how it samples by default, for the front ends that
read it before they send anything (the context size, the chat template, whether images are taken)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from engine.api.common import sampling_params
from engine.api.llama_cpp import generation_settings
from engine.api.state import ServerState
from engine.version import ninfer_version

router = APIRouter()
PATHS = ("/props",)  # behind --api-key, as llama-server keeps it


@router.get("/props")
async def props(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.ninfer
    llm, tok = state.engine.llm, state.engine.tokenizer
    defaults = sampling_params(
        state, {}, "max_tokens", 1, None
    )  # the served defaults, as a request gets them
    return {
        "default_generation_settings": {
            "n_ctx": state.max_context,
            "params": generation_settings(defaults, -1),
            "model": state.model_id,
        },
        "total_slots": llm.engine_config.max_concurrency,
        "model_alias": state.model_id,
        "model_path": llm.engine_config.model or llm.description,
        "modalities": {"vision": llm.model.visual is not None, "audio": False},
        "chat_template": (tok.chat_template or "") if tok is not None else "",
        "bos_token": (tok.bos_token or "") if tok is not None else "",
        "eos_token": (tok.eos_token or "") if tok is not None else "",
        "build_info": f"ninfer {ninfer_version()}",
        "endpoint_slots": True,
        "endpoint_props": True,
        "endpoint_metrics": True,
        "is_sleeping": bool(llm.sleep_level),  # --sleep-idle-seconds, POST /sleep
    }
