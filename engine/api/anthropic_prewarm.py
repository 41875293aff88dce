"""`max_tokens: 0` on the Messages API: Anthropic's cache pre-warming. The prompt is computed and its pages
kept in the prefix cache (a hybrid model's recurrent state too, at the request's `cache_control` marks), and
no reply is written: `content` is empty, `stop_reason` is `max_tokens`, `usage.output_tokens` 0. A client
warms a long system prompt and its tools before the first real turn (or while the user types), which then
starts from the cache. Streamed: message_start, pings while the prompt computes, message_delta,
message_stop. The engine samples one token at the prompt's end (it comes with the last prefill step, at no
extra step) and it is dropped."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api.anthropic_sse import event, failure_event, usage
from engine.api.common import complete, guarded, sampling_params, start, until_failed
from engine.api.context_editing import PARAM
from engine.api.state import ServerState
from engine.request import RequestOutput


async def prewarm(
    state: ServerState,
    body: dict,
    request: Request,
    prepare: Callable[[ServerState, dict], Awaitable[tuple]],
    hints: Callable[[ServerState, dict, str, list[int]], Awaitable[tuple[int, ...]]],
) -> JSONResponse | StreamingResponse:
    """The reply to a `max_tokens: 0` request; `prepare` and `hints` are the Messages route's own (the
    rendered prompt and its ids; the cache_control marks' token positions)."""
    text, ids, _, images, applied, _ = await prepare(state, body)
    params = sampling_params(state, {**body, "max_tokens": 1}, "max_tokens", 1, None)
    stream = await start(state, ids, params, images, snapshot_hints=await hints(state, body, text, ids))
    edited = {PARAM: {"applied_edits": applied}} if PARAM in body else {}
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    model = state.reply_model(params)

    if not body.get("stream"):
        out = (await complete(state, stream, request, False, None))[0]
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": "max_tokens",
            "stop_sequence": None,
            "usage": _usage(out),
            **edited,
        }
        return JSONResponse(message)

    def failure(out: RequestOutput) -> str | None:
        return failure_event(state, out)

    async def events():
        start_usage = {"input_tokens": len(ids), "output_tokens": 0}
        start_usage |= {"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
        shell = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": []}
        shell |= {"stop_reason": None, "stop_sequence": None, "usage": start_usage}
        yield event("message_start", {"message": shell})
        yield event("ping", {})
        out = None
        async for item in until_failed(stream, failure):
            if isinstance(item, str):  # the request failed: its error event ends the stream
                yield item
                return
            if item is None:  # the prompt still computing: Anthropic's keep-alive
                yield event("ping", {})
                continue
            out = item[0]
            state.metrics.token(out)  # (the time to the prompt's end, as a time to first token)
        state.metrics.finished(out)
        delta = {"stop_reason": "max_tokens", "stop_sequence": None}
        yield event("message_delta", {"delta": delta, "usage": _usage(out), **edited})
        yield event("message_stop", {})

    def error_event(message: str) -> str:
        return event("error", {"error": {"type": "api_error", "message": message}})

    return StreamingResponse(guarded(events(), error_event), media_type="text/event-stream")


def _usage(out: RequestOutput) -> dict[str, int]:
    """The reply's usage with no output: the one token sampled at the prompt's end is dropped."""
    return {**usage(out), "output_tokens": 0}
