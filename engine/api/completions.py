"""OpenAI text completions: `POST /v1/completions` (one prompt or several, `n` choices each, streamed or
not), with `echo` and the legacy `logprobs` (an integer: the top-N alternatives per token, in the tokens /
token_logprobs / top_logprobs / text_offset form; with `echo`, the prompt's tokens first), `max_tokens: 0`
(the prompt scored, nothing generated), vLLM's `prompt_logprobs`, and `suffix`: fill-in-the-middle, the
prompt the code before the gap and the suffix the code after it, laid out with the model's FIM tokens
(engine/fim.py; refused for a model without them, and with `echo`). `best_of` > 1 is refused in one line."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api.choices import merged, num_choices, start_choices
from engine.api.common import (
    SSE_KEEPALIVE,
    collect_choices,
    field,
    guarded,
    now,
    read_json,
    sampling_params,
    stream_failure,
    truncated_prompt,
    with_keepalive,
)
from engine.api.errors import ApiError
from engine.api.openai import finish_reason, stop_list, stream_error, token_logprobs, usage_json
from engine.api.prompt_logprobs import legacy_prompt_logprobs, prompt_logprobs_field, vllm_prompt_logprobs
from engine.api.state import ServerState
from engine.api.stream_usage import stream_usage
from engine.api.structured import openai_text_grammar
from engine.api.token_ids import TokenIds
from engine.api.token_ids import asked as token_ids_asked
from engine.api.token_names import TokenNames, token_names
from engine.fim import fim_tokens, infill_prompt, no_fim_message
from engine.request import RequestOutput

router = APIRouter()


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _prompts(state: ServerState, prompt: Any) -> list[list[int]]:
    """A string, an array of token ids, or an array of several (strings or token-id arrays)."""
    if isinstance(prompt, str) or _token_ids(prompt):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_ids(p) for p in prompt):
        return [state.encode_text(p) if isinstance(p, str) else list(p) for p in prompt]
    raise ApiError(
        400,
        "'prompt' must be a string, an array of token ids, or an array of several strings or token-id arrays",
        "prompt",
    )


def _refusals(body: dict) -> None:
    if field(body, "best_of", int, 1) != 1:
        raise ApiError(400, "only best_of=1 is supported", "best_of")


def _infill(
    state: ServerState, body: dict, prompts: list[list[int]], raw: Any
) -> tuple[list[list[int]], tuple]:
    """With a `suffix`: each prompt as the code before the gap of a FIM prompt, and the tokens that end the
    middle; as they were without one."""
    suffix = field(body, "suffix", str)
    if suffix is None:
        return prompts, ()
    tokenizer = state.engine.tokenizer
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise ApiError(400, no_fim_message(tokenizer), "suffix")
    if field(body, "echo", bool, False):
        raise ApiError(400, "'echo' cannot be combined with 'suffix' (fill-in-the-middle)", "echo")
    texts = [raw] if isinstance(raw, str) or _token_ids(raw) else raw
    # too long is refused by the context check (no cutting here, unlike llama.cpp's /infill)
    built = [infill_prompt(tokenizer, fim, prefix, suffix).token_ids for prefix in texts]
    return built, fim.stop_token_ids


def _logprobs(names: TokenNames, out: RequestOutput, top: int, start: int, offset: int) -> dict[str, Any]:
    """The legacy completions logprobs of the output tokens from `start` on; `offset`: the text length before
    them (text_offset counts from the start of the returned text)."""
    tokens, logprobs, top_logprobs, text_offset = [], [], [], []
    for token, logprob, alts in token_logprobs(out, top, start):
        piece = names.piece(token)
        tokens.append(names.name(token, piece))
        logprobs.append(logprob)
        top_logprobs.append({names.name(t): v for t, v in alts})
        text_offset.append(offset)
        offset += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def _nothing_generated(out: RequestOutput) -> RequestOutput:
    """A max_tokens 0 request's output: its one generated token dropped, ended by the length limit."""
    return replace(
        out, token_ids=[], text="", logprobs=[] if out.logprobs is not None else None, finish_reason="length"
    )


@router.post("/v1/completions")
async def completions(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    prompts = await asyncio.to_thread(_prompts, state, body.get("prompt"))  # (off the event loop)
    _refusals(body)
    prompts, fim_stops = await asyncio.to_thread(_infill, state, body, prompts, body.get("prompt"))
    if fim_stops and body.get("truncate_prompt_tokens") is not None:
        raise ApiError(
            400,
            "'truncate_prompt_tokens' does not go with 'suffix' (a cut would drop the FIM tokens); llama.cpp's "
            "/infill cuts a long gap's code to fit",
            "truncate_prompt_tokens",
        )
    n = num_choices(body, len(prompts))
    echo = field(body, "echo", bool, False)
    top = field(body, "logprobs", int)
    names = token_names(state, body)
    vllm_top = prompt_logprobs_field(body)
    # the prompt's own log-probabilities: asked for directly (vLLM), or echoed with the legacy logprobs
    prompt_top = max(top if echo and top is not None else -1, -1 if vllm_top is None else vllm_top)
    # max_tokens 0: score the prompt only (one token is generated and dropped)
    score_only = field(body, "max_tokens", int, 16) == 0
    stream = field(body, "stream", bool, False)
    grammar = openai_text_grammar(body)
    params = sampling_params(
        state,
        {**body, "max_tokens": 1} if score_only else body,
        "max_tokens",
        16,
        stop_list(body),
        grammar=grammar,
        logprobs=top,
        prompt_logprobs=None if prompt_top < 0 else prompt_top,
    )
    if fim_stops:
        params = replace(params, stop_token_ids=(*params.stop_token_ids, *fim_stops))
    prompts = [truncated_prompt(body, ids, state.max_context, params.max_tokens) for ids in prompts]
    usage_options = stream_usage(body, stream, prompts)
    streams = await start_choices(state, prompts, params, n)
    echoes = [state.engine.tokenizer.decode(ids) if echo else "" for ids in prompts]
    prompt_texts = [text for text in echoes for _ in range(n)]  # choice i answers prompt i // n
    rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", now()

    def payload(choices: list[dict], usage: dict | None = None) -> dict:
        body = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": state.reply_model(params),
            "choices": choices,
        }
        return body if usage is None else {**body, "usage": usage}

    def choice(index: int, text: str, finish: str | None, logprobs: dict | None) -> dict:
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}

    latest: list[RequestOutput | None] = [None] * len(streams)  # each choice's latest output (streamed)
    return_ids = token_ids_asked(body)  # vLLM's return_token_ids
    sent_ids, prompt_ids_sent = TokenIds(return_ids, len(streams)), [False] * len(streams)

    def event(index: int, text: str, finish: str | None, logprobs: dict | None) -> str:
        one = choice(index, text, finish, logprobs)
        if return_ids:
            one["token_ids"] = sent_ids.take(index)
            if not prompt_ids_sent[index]:
                one["prompt_token_ids"], prompt_ids_sent[index] = list(prompts[index // n]), True
        chunk = usage_options.add_to(payload([one]), latest)
        return f"data: {json.dumps(chunk)}\n\n"

    def echoed_logprobs(out: RequestOutput) -> dict | None:
        """The prompt's legacy logprobs, when echoed with them."""
        return legacy_prompt_logprobs(names, out, top) if echo and top is not None else None

    if not stream:
        outs = await collect_choices(state, streams, request)
        choices = []
        for index, out in enumerate(outs):
            if score_only:
                outs[index] = out = _nothing_generated(out)
            text = prompt_texts[index]
            logprobs = _logprobs(names, out, top, 0, len(text)) if top is not None else None
            if echo and top is not None:
                logprobs = {k: echoed_logprobs(out)[k] + logprobs[k] for k in logprobs}
            choices.append(choice(index, text + out.text, finish_reason(out), logprobs))
            if return_ids:
                choices[-1].update(prompt_token_ids=list(out.prompt_token_ids), token_ids=list(out.token_ids))
            if vllm_top is not None:
                choices[-1]["prompt_logprobs"] = vllm_prompt_logprobs(state, out, vllm_top)
        return JSONResponse(payload(choices, usage_json(*outs, n=n)))

    async def events():
        sent_tokens = [0] * len(streams)
        sent_text = [len(text) for text in prompt_texts]
        # with logprobs, an echo waits for the prompt's, which come with the choice's first token
        echoed = [not echo] * len(streams)
        outputs = merged(streams)
        ticks = with_keepalive(outputs)  # the outputs, and a None whenever they keep silent
        try:
            if echo and top is None:
                for index, text in enumerate(prompt_texts):
                    yield event(index, text, None, None)
                echoed = [True] * len(streams)
            async for item in ticks:
                if item is None:  # nothing yet (a long prompt prefilling): keep the connection alive
                    yield SSE_KEEPALIVE
                    continue
                index, out, delta = item
                failure = stream_failure(state, out)
                if failure is not None:
                    yield stream_error(failure)
                    return
                state.metrics.token(out)
                if score_only:
                    out, delta = _nothing_generated(out), ""
                latest[index] = out
                sent_ids.seen(index, out)
                if not echoed[index]:
                    yield event(index, prompt_texts[index], None, echoed_logprobs(out))
                    echoed[index] = True
                if (delta or out.finished) and not (score_only and not out.finished):
                    logprobs = None
                    if top is not None:
                        logprobs = _logprobs(names, out, top, sent_tokens[index], sent_text[index])
                        sent_tokens[index] = len(out.token_ids)
                    sent_text[index] += len(delta)
                    yield event(index, delta, finish_reason(out) if out.finished else None, logprobs)
                if out.finished:
                    state.metrics.finished(out)
            if usage_options.include:
                yield f"data: {json.dumps(payload([], usage_json(*latest, n=n)))}\n\n"  # all finished
            yield "data: [DONE]\n\n"
        finally:
            await ticks.aclose()  # (its reader first: it reads the outputs)
            await outputs.aclose()  # the client went away mid-stream: their KV is freed now

    return StreamingResponse(guarded(events(), stream_error), media_type="text/event-stream")
