"""The Messages API's server-sent events: one event's text, and the error event of a reply that ended
without its end (expired waiting for admission: `overloaded_error`; else `api_error`)."""

from __future__ import annotations

import json
from typing import Any

from engine.api.common import stream_failure
from engine.request import RequestOutput


def event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def failure_event(state, out: RequestOutput) -> str | None:
    """The error event of a request that ended without its reply (None: it goes on)."""
    message = stream_failure(state, out)
    if message is None:
        return None
    kind = "overloaded_error" if out.finish_reason == "expired" else "api_error"
    return event("error", {"error": {"type": kind, "message": message}})
