"""Ollama's `keep_alive`: how long the model stays loaded once a request is done.

Here "unloaded" is sleep level 1 (engine/worker/sleep.py: the device memory given back, the weights, KV pool
and prefix cache held in host memory; the next request wakes it). A request's keep_alive holds from then on:
0 sleeps as soon as the work is done, a negative one never, a duration after that long idle; a request
without one goes back to `--sleep-idle-seconds` (by default: never). Values as Ollama reads them: a number
of seconds, or a Go duration string ("5m", "1h30m", "300ms", "-1m"); a bare number string as seconds.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

from fastapi.responses import JSONResponse

from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.errors import DeviceMemoryBusy, NinferError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"[+-]?(?:{_NUMBER}(?:ns|us|µs|μs|ms|s|m|h))+")
_BARE = re.compile(rf"[+-]?{_NUMBER}")
NEVER = "0001-01-01T00:00:00Z"  # Ollama's zero time: a model that is never unloaded


def keep_alive_seconds(value: Any) -> float | None:
    """Seconds the model stays loaded once idle (math.inf: for good); None when the request sets none."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if _BARE.fullmatch(text):
            seconds = float(text)
        elif _DURATION.fullmatch(text):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
            seconds = -seconds if text.startswith("-") else seconds
    if seconds is None:
        raise ApiError(
            400,
            '\'keep_alive\' must be a number of seconds or a duration such as "5m", "1h30m" or "-1m" '
            f"(negative: stay loaded; 0: unload once done); got {value!r}",
            "keep_alive",
        )
    return math.inf if seconds < 0 else seconds


async def load_or_unload(state: ServerState, seconds: float | None, reply: dict[str, Any]) -> JSONResponse:
    """A request with nothing to run: keep_alive 0 puts the model to sleep now (as Ollama unloads it);
    otherwise it is woken if asleep ("load") and stays for the keep_alive given."""
    unload = seconds == 0
    try:
        if unload:
            await state.engine.sleep(1)
        else:
            if state.engine.llm.sleep_level:
                await state.engine.wake_up()
            await state.engine.keep_alive(seconds)
    except DeviceMemoryBusy as e:
        raise ApiError(503, str(e), retry_after=10) from e
    except NinferError as e:  # requests in flight, or host memory short
        raise ApiError(409, str(e)) from e
    return JSONResponse({**reply, "done": True, "done_reason": "unload" if unload else "load"})


def expires_at(state: ServerState) -> str:
    """When the model would be unloaded if no request came (/api/ps), in Ollama's RFC 3339 form."""
    at = state.engine.sleeps_at()
    if at is None:
        return NEVER
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
