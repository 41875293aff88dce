"""OpenAI text completions: `POST /v1/completions` (one prompt, streamed or not), with `echo` and the
legacy `logprobs` (an integer: the top-N alternatives per token, in the tokens / token_logprobs /
top_logprobs / text_offset form). `suffix` (fill-in-the-middle) and `best_of` > 1 are refused in one line."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api.common import (
    check_expired,
    collect,
    field,
    now,
    read_json,
    sampling_params,
    start,
    stream_failure,
)
from engine.api.errors import ApiError
from engine.api.openai import finish_reason, stop_list, stream_error, token_logprobs, usage_json
from engine.api.state import ServerState
from engine.api.structured import openai_text_grammar
from engine.request import RequestOutput

router = APIRouter()


def _prompt_ids(state: ServerState, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return state.engine.tokenizer.encode(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    raise ApiError(
        400, "'prompt' must be a string or an array of token ids (one prompt per request)", "prompt"
    )


def _refusals(body: dict) -> None:
    if field(body, "n", int, 1) != 1:
        raise ApiError(400, "only n=1 is supported", "n")
    if field(body, "best_of", int, 1) != 1:
        raise ApiError(400, "only best_of=1 is supported", "best_of")
    if field(body, "suffix", str):
        raise ApiError(
            400,
            "'suffix' (fill-in-the-middle) is not supported; send the text after the gap in the prompt "
            "with the model's own FIM tokens",
            "suffix",
        )


def _logprobs(state: ServerState, out: RequestOutput, top: int, start: int, offset: int) -> dict[str, Any]:
    """The legacy completions logprobs of the output tokens from `start` on; `offset`: the text length before
    them (text_offset counts from the start of the returned text)."""
    tokens, logprobs, top_logprobs, text_offset = [], [], [], []
    for piece, logprob, alts in token_logprobs(state, out, top, start):
        tokens.append(piece)
        logprobs.append(logprob)
        top_logprobs.append(dict(alts))
        text_offset.append(offset)
        offset += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


@router.post("/v1/completions")
async def completions(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    ids = _prompt_ids(state, body.get("prompt"))
    _refusals(body)
    echo = field(body, "echo", bool, False)
    top = field(body, "logprobs", int)
    if top is not None and echo:
        raise ApiError(
            400,
            "'echo' with 'logprobs' needs the prompt's log-probabilities, which this server does not compute",
        )
    stream = field(body, "stream", bool, False)
    grammar = openai_text_grammar(body)
    params = sampling_params(body, "max_tokens", 16, stop_list(body), grammar=grammar, logprobs=top)
    engine_stream = await start(state, ids, params)
    prompt_text = state.engine.tokenizer.decode(ids) if echo else ""
    rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", now()

    def payload(text: str, finish: str | None, logprobs: dict | None, usage: dict | None = None) -> dict:
        body = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": state.model_id,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}],
        }
        return body if usage is None else {**body, "usage": usage}

    if not stream:
        out = await collect(engine_stream, request)
        check_expired(out)
        state.metrics.finished(out)
        logprobs = _logprobs(state, out, top, 0, 0) if top is not None else None
        return JSONResponse(payload(prompt_text + out.text, finish_reason(out), logprobs, usage_json(out)))

    async def events():
        sent_tokens, sent_text = 0, len(prompt_text)
        try:
            if echo:
                yield f"data: {json.dumps(payload(prompt_text, None, None))}\n\n"
            out = None
            async for out, delta in engine_stream:
                failure = stream_failure(state, out)
                if failure is not None:
                    yield stream_error(failure)
                    return
                state.metrics.token(out)
                if delta or out.finished:
                    logprobs = None
                    if top is not None:
                        logprobs = _logprobs(state, out, top, sent_tokens, sent_text)
                        sent_tokens = len(out.token_ids)
                    sent_text += len(delta)
                    finish = finish_reason(out) if out.finished else None
                    yield f"data: {json.dumps(payload(delta, finish, logprobs))}\n\n"
            state.metrics.finished(out)
            yield "data: [DONE]\n\n"
        finally:
            engine_stream.abort()

    return StreamingResponse(events(), media_type="text/event-stream")
