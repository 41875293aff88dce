"""llama.cpp's native routes, for the editor plugins and scripts written against llama-server:
`POST /completion` (a raw prompt) and `POST /infill` (code completion: `input_prefix`, `input_suffix`,
`input_extra` files, `prompt` after the middle token; see engine/fim.py), streamed (`data: {...}` events,
each with `content` and `stop`; the last carries the totals) or not.

Their fields, with llama.cpp's names: n_predict (-1: until the context ends; 0: the prompt is read into the
prefix cache and nothing is generated, as editors warm it), temperature, dynatemp_range,
dynatemp_exponent, top_k, top_p, min_p, typical_p, top_n_sigma, xtc_probability, xtc_threshold,
dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers, repeat_penalty,
repeat_last_n, presence_penalty, frequency_penalty, mirostat, mirostat_tau, mirostat_eta, seed (-1: random),
stop, ignore_eos,
logit_bias ([[id or text, bias or false], ...] or {id: bias}), n_probs, grammar (GBNF or Lark), json_schema,
n_indent, t_max_predict_ms, return_tokens, response_fields. Left out, sampling fields take the served
model's defaults (--generation-config) as the OpenAI routes do, not llama.cpp's own. Hints for
llama.cpp's own cache and slots (cache_prompt, id_slot, n_keep, samplers, t_max_prompt_ms, ...) are
taken and have nothing to do: the prefix cache is always on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api.common import (
    SSE_KEEPALIVE,
    collect_choices,
    field,
    guarded,
    is_token_id,
    read_json,
    sampling_params,
    start,
    stream_failure,
    top_alternatives,
    with_keepalive,
)
from engine.api.errors import ApiError
from engine.api.infill_limits import InfillLimits
from engine.api.openai import stream_error
from engine.api.state import ServerState
from engine.api.structured import llama_cpp_grammar
from engine.api.timings import Clock, with_progress
from engine.async_llm import AsyncStream
from engine.errors import NinferError
from engine.fim import ExtraFile, fim_tokens, infill_prompt, no_fim_message
from engine.request import LLAMA_CPP_FIELDS, RequestOutput, SamplingParams

router = APIRouter()
PATHS = ("/completion", "/infill")  # behind --api-key like /v1/*

# llama.cpp's sampling field -> the OpenAI-style name sampling_params reads
_RENAMED = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "ignore_eos": "ignore_eos",
}


@router.post("/completion")
async def completion(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    ids = await asyncio.to_thread(_prompt_ids, state, body.get("prompt"))  # (off the event loop)
    n_predict = _n_predict(body)
    return await _reply(state, request, body, ids, n_predict, truncated=False, stop_ids=())


@router.post("/infill")
async def infill(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    tokenizer = state.engine.tokenizer
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise ApiError(400, no_fim_message(tokenizer))
    prompt = field(body, "prompt", str, "")
    n_predict = _n_predict(body)
    if n_predict >= state.max_context:
        raise ApiError(
            400,
            f"n_predict {n_predict} is beyond the context limit {state.max_context} (--max-context); ask for "
            f"{state.max_context - 1} at most (the prompt takes its share of the context too)",
        )
    reserve = n_predict if n_predict > 0 else state.default_max_tokens()
    try:
        built = await asyncio.to_thread(  # (off the event loop: the extra files encode for a while)
            infill_prompt,
            tokenizer,
            fim,
            field(body, "input_prefix", str, ""),
            field(body, "input_suffix", str, ""),
            budget=state.max_context - 1 - reserve,
            middle=prompt,
            extra=_extra_files(body),
            filename=field(body, "filename", str),
        )
    except NinferError as e:
        raise ApiError(400, str(e)) from e
    return await _reply(state, request, body, built.token_ids, n_predict, built.truncated, fim.stop_token_ids)


def _prompt_ids(state: ServerState, prompt: Any) -> list[int]:
    """A string, token ids, or a mix of the two (a string's text encoded in place; the first one with
    the tokenizer's BOS where it adds one)."""
    parts = [prompt] if isinstance(prompt, str) or is_token_id(prompt) else prompt
    good = isinstance(parts, list) and parts and all(isinstance(p, str) or is_token_id(p) for p in parts)
    if not good:
        raise ApiError(
            400,
            "'prompt' must be a string, an array of token ids, or an array mixing the two; several prompts "
            "a request are taken by /v1/completions",
            "prompt",
        )
    ids: list[int] = []
    for i, part in enumerate(parts):
        ids += state.encode_text(part, i == 0) if isinstance(part, str) else [part]
    if not ids:
        raise ApiError(400, "the prompt is empty", "prompt")
    return ids


def _n_predict(body: dict) -> int:
    n = field(body, "n_predict", int, -1)
    if n < -1:
        raise ApiError(400, f"'n_predict' must be -1 (no limit), 0 or more (got {n})", "n_predict")
    return n


def _extra_files(body: dict) -> tuple[ExtraFile, ...]:
    extra = field(body, "input_extra", list, [])
    shape = '\'input_extra\' must be an array of {"filename": string, "text": string}'
    files = []
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, shape, "input_extra")
        name = chunk.get("filename", "")
        if not isinstance(name, str):
            raise ApiError(400, shape, "input_extra")
        files.append(ExtraFile(name, chunk["text"]))
    return tuple(files)


def _logit_bias(state: ServerState, body: dict) -> dict[str, float] | None:
    """llama.cpp's [[token id or text, bias or false], ...] or {"id": bias} as OpenAI's {"id": bias}; a
    text biases each of its tokens, false bans."""
    bias = body.get("logit_bias")
    if bias is None or isinstance(bias, dict):
        return bias
    shape = "'logit_bias' must be [[token id or text, bias or false], ...] or {\"token id\": bias}"
    if not isinstance(bias, list):
        raise ApiError(400, shape, "logit_bias")
    out: dict[str, float] = {}
    for pair in bias:
        if not (
            isinstance(pair, list) and len(pair) == 2 and (is_token_id(pair[0]) or isinstance(pair[0], str))
        ):
            raise ApiError(400, shape, "logit_bias")
        value = -100.0 if pair[1] is False else pair[1]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(400, shape, "logit_bias")
        ids = [pair[0]] if is_token_id(pair[0]) else state.text_tokenizer().encode(pair[0], False)
        out.update({str(i): float(value) for i in ids})
    return out


def _params(state: ServerState, body: dict, max_tokens: int, stop_ids: tuple[int, ...]):
    asked = {new: body[old] for old, new in _RENAMED.items() if old in body}
    asked.update({name: body[name] for name in LLAMA_CPP_FIELDS if name in body})
    seed = field(body, "seed", int)
    stop = field(body, "stop", list)
    if stop is not None and not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "'stop' must be an array of strings", "stop")
    n_probs = field(body, "n_probs", int, 0)
    if n_probs < 0:
        raise ApiError(400, f"'n_probs' must be 0 or more (got {n_probs})", "n_probs")
    translated = {
        **asked,
        "max_tokens": max_tokens,
        "seed": None if seed is None or seed < 0 else seed,
        "logit_bias": _logit_bias(state, body),
        "stop_token_ids": list(stop_ids) or None,
        "model": body.get("model"),  # a LoRA adapter's name picks it
        "lora": body.get("lora"),  # or a list of adapter ids and scales
    }
    grammar = llama_cpp_grammar(body)
    params = sampling_params(
        state, translated, "max_tokens", max_tokens, stop or None, grammar=grammar, logprobs=n_probs or None
    )
    return with_progress(params, body)


async def _reply(
    state: ServerState,
    request: Request,
    body: dict,
    ids: list[int],
    n_predict: int,
    truncated: bool,
    stop_ids: tuple[int, ...],
):
    # n_predict 0 reads the prompt only: one token is generated and dropped
    max_tokens = 1 if n_predict == 0 else n_predict if n_predict > 0 else max(1, state.max_context - len(ids))
    params = _params(state, body, max_tokens, stop_ids)
    limits = InfillLimits(field(body, "n_indent", int, 0), field(body, "t_max_predict_ms", int, 0))
    fields = field(body, "response_fields", list)
    if fields is not None and not all(isinstance(f, str) for f in fields):
        raise ApiError(400, "'response_fields' must be an array of field names", "response_fields")
    return_tokens = field(body, "return_tokens", bool, False)
    began = time.perf_counter()
    stream = await start(state, ids, params)
    run = _Run(stream, params, limits, n_predict, began)

    def result(out: RequestOutput) -> dict[str, Any]:
        return _picked(_final(state, out, ids, run, truncated, return_tokens), fields)

    if not field(body, "stream", bool, False):
        (out,) = await collect_choices(state, [run], request)  # a stream with the limits applied
        return JSONResponse(result(out))

    async def events():
        sent = 0
        ticks = with_keepalive(run)  # the outputs, and a None whenever they keep silent
        try:
            async for item in ticks:
                if item is None:  # nothing yet (a long prompt prefilling): keep the connection alive
                    yield SSE_KEEPALIVE
                    continue
                out, delta = item
                if out.prompt_progress is not None:
                    part = {
                        "index": 0,
                        "content": "",
                        "stop": False,
                        "prompt_progress": run.clock.progress(out),
                    }
                    yield f"data: {json.dumps(part)}\n\n"
                    continue
                failure = stream_failure(state, out)
                if failure is not None:
                    yield stream_error(failure)
                    return
                state.metrics.token(out)
                if out.finished:  # the totals, with the text not sent yet (clients join every content)
                    state.metrics.finished(out)
                    yield f"data: {json.dumps({**result(out), 'content': delta})}\n\n"
                    return
                if delta:
                    part = {
                        "index": 0,
                        "content": delta,
                        "stop": False,
                        "tokens_predicted": len(out.token_ids),
                        "tokens_evaluated": len(ids),
                    }
                    if return_tokens:
                        part["tokens"] = out.token_ids[sent:]
                    if params.logprobs:
                        part["completion_probabilities"] = _probabilities(state, out, params.logprobs, sent)
                    sent = len(out.token_ids)
                    yield f"data: {json.dumps(_picked(part, fields))}\n\n"
        finally:
            stream.abort()  # the client went away mid-stream: their KV is freed now
            await ticks.aclose()

    return StreamingResponse(guarded(events(), stream_error), media_type="text/event-stream")


class _Run:
    """One request's outputs with the infill limits applied and the text held as they need; records when
    the first token came and when the last did. Iterated and aborted as an AsyncStream is."""

    def __init__(
        self,
        stream: AsyncStream,
        params: SamplingParams,
        limits: InfillLimits,
        n_predict: int,
        began: float,
    ):
        self.stream, self.params, self.limits = stream, params, limits
        self.n_predict, self.clock = n_predict, Clock(began)
        self.cut = False  # ended by n_indent or t_max_predict_ms

    async def __aiter__(self) -> AsyncIterator[tuple[RequestOutput, str]]:
        sent = released = 0  # released: the text the engine let go (a tail that may become a stop string
        async for out, new in self.stream:  # is held until it cannot)
            released += len(new)
            if out.prompt_progress is not None:  # between prompt chunks: passed on as it is
                yield out, ""
                continue
            self.clock.token(out)
            if self.n_predict == 0:  # the prompt read, its one token dropped
                out = replace(out, token_ids=[], text="", logprobs=None if out.logprobs is None else [])
            at = self.limits.cut_at(out.text)
            clock = self.clock
            late = self.limits.out_of_time(
                out.text, (clock.last - clock.first) * 1000 if clock.first else 0.0
            )
            # (a line indented less may come in the step that ends the reply: it is cut all the same)
            if at is not None or (late and not out.finished):
                self.cut = True
                if not out.finished:
                    self.stream.abort()
                out = replace(out, text=out.text if at is None else out.text[:at], finish_reason="length")
            end = len(out.text) if out.finished else min(self.limits.sendable(out.text), released)
            delta, sent = out.text[sent:end], max(sent, end)
            yield out, delta
            if out.finished:
                return

    def abort(self) -> None:
        self.stream.abort()


def generation_settings(params: SamplingParams, n_predict: int) -> dict[str, Any]:
    """llama.cpp's generation_settings: the sampling a reply ran with (GET /props: the served defaults)."""
    return {
        "n_predict": n_predict,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "seed": -1 if params.seed is None else params.seed,
        "stop": list(params.stop or ()),
        "ignore_eos": params.ignore_eos,
        "n_probs": params.logprobs or 0,
        **{name: getattr(params, name) for name in LLAMA_CPP_FIELDS},
        # None (vLLM's counting: the repetition penalty over the whole context) reads as llama.cpp's -1
        "repeat_last_n": -1 if params.repeat_last_n is None else params.repeat_last_n,
        "dry_sequence_breakers": list(params.dry_sequence_breakers),
    }


def _stop_type(out: RequestOutput, run: _Run) -> str:
    if run.cut or out.finish_reason == "length":
        return "limit"
    if out.finish_reason == "stop":
        return "word" if out.stop_string is not None else "eos"
    return "none"


def _final(
    state: ServerState, out: RequestOutput, ids: list[int], run: _Run, truncated: bool, return_tokens: bool
) -> dict[str, Any]:
    """llama.cpp's final object: the text, why it stopped, the counts and the timings."""
    params = run.params
    predicted_n = len(out.token_ids)
    settings = generation_settings(params, run.n_predict)
    reply = {
        "index": 0,
        "content": out.text,
        "tokens": list(out.token_ids) if return_tokens else [],
        "stop": True,
        "model": state.reply_model(params),
        "tokens_predicted": predicted_n,
        "tokens_evaluated": len(ids),
        "generation_settings": settings,
        "prompt": _decoded(state, ids),
        "has_new_line": "\n" in out.text,
        "truncated": truncated,
        "stop_type": _stop_type(out, run),
        "stopping_word": out.stop_string or "",
        "tokens_cached": out.num_cached_tokens,
        "timings": run.clock.timings(out, len(ids)),
    }
    if params.logprobs:
        reply["completion_probabilities"] = _probabilities(state, out, params.logprobs, 0)
    return reply


def _probabilities(state: ServerState, out: RequestOutput, top: int, start: int) -> list[dict[str, Any]]:
    """llama.cpp's completion_probabilities of the output tokens from `start` on."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = _decoded(state, [token])
        return {"id": token, "token": text, "bytes": list(text.encode()), "logprob": logprob}

    probs = []
    for token, logprobs in zip(out.token_ids[start:], (out.logprobs or [])[start:]):
        alts = top_alternatives(logprobs, top)
        probs.append(
            {
                **entry(token, logprobs.get(token, float("-inf"))),
                "top_logprobs": [entry(t, v) for t, v in alts],
            }
        )
    return probs


def _decoded(state: ServerState, ids: list[int]) -> str:
    """The ids' text, special tokens included ("" for a model without a tokenizer)."""
    tokenizer = state.engine.tokenizer
    return "" if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=False)


def _picked(reply: dict[str, Any], fields: list | None) -> dict[str, Any]:
    """llama.cpp's response_fields: only the named fields, a nested one ("timings/prompt_n") under its
    path as the name; a field the reply lacks is left out."""
    if fields is None:
        return reply
    picked = {}
    for path in fields:
        value: Any = reply
        for key in path.split("/"):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            picked[path] = value
    return picked


_MISSING = object()
