"""The LoRA routes. vLLM's: load and unload an adapter while serving (`POST /v1/load_lora_adapter`,
`/v1/unload_lora_adapter`), on only with `serve --enable-lora` (vLLM asks for VLLM_ALLOW_RUNTIME_LORA_UPDATING).
llama-server's: `GET /lora-adapters` lists the loaded adapters with their ids and the scales a request runs
them at when it picks none itself, `POST /lora-adapters` sets those scales ([{"id": ..., "scale": ...}]: each
adapter named at its scale, the others at 0)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from engine.api.common import field, read_json
from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.errors import NinferError

router = APIRouter()
PATHS = ("/lora-adapters",)  # behind --api-key, as llama-server keeps it (vLLM's are under /v1/)


async def _lora_request(request: Request) -> tuple[ServerState, dict, str]:
    """(state, body, its lora_name) of a load / unload request, once the server allows them."""
    state: ServerState = request.app.state.ninfer
    if not state.lora_updates:
        raise ApiError(
            404,
            "loading LoRA adapters while serving is off; start serve with --enable-lora (adapters given with "
            "--lora load at start-up)",
        )
    body = await read_json(request)
    return state, body, field(body, "lora_name", str, required=True)


@router.post("/v1/load_lora_adapter")
async def load(request: Request):
    state, body, name = await _lora_request(request)
    path = field(body, "lora_path", str, required=True)
    if name == state.model_id:
        raise ApiError(
            400, f"'{name}' is the served model's name; give the adapter a name of its own", "lora_name"
        )
    try:
        await state.engine.load_adapter(name, path)
    except NinferError as e:
        raise ApiError(400, str(e)) from e
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload(request: Request):
    state, _, name = await _lora_request(request)
    if name not in state.engine.llm.adapters.slots:
        raise ApiError(404, f"no LoRA adapter '{name}' is loaded", "lora_name")
    try:
        await state.engine.unload_adapter(name)
    except NinferError as e:
        raise ApiError(409, str(e)) from e
    state.lora_defaults.pop(name, None)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _listing(state: ServerState) -> list[dict]:
    adapters = state.engine.llm.adapters
    return [
        {"id": slot, "path": adapters.paths[name], "scale": state.lora_defaults.get(name, 0.0)}
        for name, slot in sorted(adapters.slots.items(), key=lambda item: item[1])
    ]


@router.get("/lora-adapters")
async def lora_adapters(request: Request):
    return JSONResponse(_listing(request.app.state.ninfer))


@router.post("/lora-adapters")
async def set_lora_scales(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request, allow_list=True)
    state.lora_defaults = state.lora_scales(body, "body")
    return JSONResponse({"success": True})
