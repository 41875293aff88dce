"""Ollama's model-management routes, for the clients that pull a model before they use it (`ollama pull`,
`ollama run`, editors that offer to fetch a missing model).

`POST /api/pull` of a served name (the model or a LoRA adapter, `:latest` or not) answers as Ollama does for
a model already up to date: `{"status": "success"}` (a one-line NDJSON stream unless `stream` is false). Any
other name is refused in one sentence: this server pulls nothing, it serves the model it was started with.
`/api/push`, `/api/create`, `/api/copy`, `DELETE /api/delete` and `/api/blobs/<digest>` change the models a
server holds, which here only a restart does: 501 with that sentence. Errors: Ollama's `{"error"}`.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api.common import field, read_json
from engine.api.errors import ApiError
from engine.api.state import ServerState

router = APIRouter()
RESTART = "restart `ninfer serve` with another model to change it (`ninfer fetch` downloads one)"


@router.post("/api/pull")
async def pull(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, "'model' is required: the name to pull", "model")
    served = [state.model_id, *state.engine.llm.adapters.names]
    if name.removesuffix(":latest") not in served:
        listed = ", ".join(f"'{m}'" for m in served)
        raise ApiError(
            404,
            f"model '{name}' is not served here and this server pulls nothing: it serves {listed}; {RESTART}",
        )
    done = {"status": "success"}
    if not field(body, "stream", bool, True):
        return JSONResponse(done)
    return StreamingResponse(iter([json.dumps(done) + "\n"]), media_type="application/x-ndjson")


@router.post("/api/push")
@router.post("/api/create")
@router.post("/api/copy")
@router.delete("/api/delete")
@router.api_route("/api/blobs/{digest}", methods=["HEAD", "POST"])
async def manage(request: Request):
    state: ServerState = request.app.state.ninfer
    route = request.url.path if not request.url.path.startswith("/api/blobs/") else "/api/blobs"
    raise ApiError(
        501,
        f"{request.method} {route} is not served: this server serves the model it was started with "
        f"('{state.model_id}'); {RESTART}",
    )
