"""What the Messages API's replies share (the reply route, its pre-warm): a reply's `usage`; one server-sent
event's text, and the error event of a reply that ended without its end (expired waiting for admission:
`overloaded_error`; else `api_error`)."""

from __future__ import annotations

import json
from typing import Any

from engine.api.common import stream_failure
from engine.request import RequestOutput


def usage(out: RequestOutput) -> dict[str, int]:
    """The prompt's tokens, those the prefix cache held apart, and the output's."""
    cached = out.num_cached_tokens
    return {
        "input_tokens": len(out.prompt_token_ids) - cached,
        "output_tokens": len(out.token_ids),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def failure_event(state, out: RequestOutput) -> str | None:
    """The error event of a request that ended without its reply (None: it goes on)."""
    message = stream_failure(state, out)
    if message is None:
        return None
    kind = "overloaded_error" if out.finish_reason == "expired" else "api_error"
    return event("error", {"error": {"type": kind, "message": message}})
