"""Sleep by hand (vLLM's routes): `POST /sleep?level=1|2` gives the device memory back while the server idles
(engine/worker/sleep.py), `POST /wake_up` takes it again (any request does too), `GET /is_sleeping` says
which. `serve --sleep-idle-seconds N` sleeps by itself (llama-server's flag); /props says `is_sleeping`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.errors import DeviceMemoryBusy, NinferError

router = APIRouter()
PATHS = ("/sleep", "/wake_up")  # behind --api-key (they change what the server holds)


def _state(request: Request) -> ServerState:
    return request.app.state.ninfer


@router.post("/sleep")
async def sleep(request: Request):
    raw = request.query_params.get("level", "1")
    if raw not in ("1", "2"):
        raise ApiError(
            400,
            f"level {raw!r} is not 1 (weights, KV pool and prefix cache held in host memory) or 2 (weights "
            "held, KV pool and prefix cache dropped)",
            "level",
        )
    engine = _state(request).engine
    try:
        message = await engine.sleep(int(raw))
    except NinferError as e:  # requests in flight, or host memory short
        raise ApiError(409, str(e)) from e
    # the level it sleeps at (an earlier one's when it was asleep already)
    return {"is_sleeping": True, "level": engine.llm.sleep_level, "message": message}


@router.post("/wake_up")
async def wake_up(request: Request):
    try:
        message = await _state(request).engine.wake_up()
    except DeviceMemoryBusy as e:
        raise ApiError(503, str(e), retry_after=10) from e
    return {"is_sleeping": False, "message": message}


@router.get("/is_sleeping")
async def is_sleeping(request: Request):
    level = _state(request).engine.llm.sleep_level
    return {"is_sleeping": bool(level), "level": level}
