"""Ollama's generation routes: `POST /api/chat`, `POST /api/generate`, `POST /api/embed` (and the older
`/api/embeddings`), for the clients that speak Ollama's own protocol.

A request is read into the fields the OpenAI routes take (messages with base64 `images` as image parts,
`tools`, `format` as a response format, `think` as the template's thinking switch or a reasoning effort,
`options` as sampling fields) and runs through the same template, grammar and engine code. Replies are
Ollama's: streamed (the default) as NDJSON lines, `message.content` / `message.thinking` (or `response` /
`thinking`) deltas, each tool call whole with its `arguments` as an object, then a last line with `done`,
`done_reason` and the counts and durations (nanoseconds); or one object with `stream: false`.
`num_predict` left out, negative or past what fits lets the reply run to the context limit, as Ollama
does. Server-side options (`num_ctx`, `num_gpu`, `num_thread`, ...) are not per request here and are left
alone. A request with nothing to run loads the model (wakes it if asleep), or with `keep_alive` 0 unloads
it (sleep level 1, as `POST /sleep` does); every request's `keep_alive` sets how long the model stays
awake once idle (engine/api/ollama_keep_alive.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api import snapshot_hints
from engine.api.common import (
    collect_choices,
    field,
    guarded,
    pooled,
    read_json,
    sampling_params,
    start,
    stream_failure,
    with_effort,
)
from engine.api.errors import ApiError
from engine.api.images import preprocess_images
from engine.api.ollama_keep_alive import keep_alive_seconds, load_or_unload
from engine.api.openai import chat_tools, stop_list, template_messages
from engine.api.state import ServerState
from engine.api.structured import openai_grammar
from engine.errors import NinferError
from engine.fim import fim_tokens, infill_prompt, no_fim_message
from engine.parsers.reply import ReplyParser, parse_reply
from engine.pooling import truncated

router = APIRouter()
# Ollama's options -> the sampling fields they set
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "num_predict": "max_tokens",
}
THINK_LEVELS = ("low", "medium", "high")


@router.post("/api/chat")
async def chat(request: Request):
    state: ServerState = request.app.state.ninfer
    started = time.monotonic()
    body = await read_json(request)
    if body.get("messages") == []:  # Ollama's way to load (or, keep_alive 0, unload) the model
        empty = {**_head(state, body), "message": {"role": "assistant", "content": ""}}
        return await load_or_unload(state, keep_alive_seconds(body.get("keep_alive")), empty)
    messages, images = template_messages(_messages(body.get("messages")))
    _takes(state, images)
    tools = (chat_tools({"tools": body["tools"]}) or None) if body.get("tools") is not None else None
    prompt_text, ids = await asyncio.to_thread(state.render, messages, tools, _think(body))
    return await _run(state, request, body, ids, images, tools, prompt_text, started, "chat")


@router.post("/api/generate")
async def generate(request: Request):
    state: ServerState = request.app.state.ninfer
    started = time.monotonic()
    body = await read_json(request)
    prompt = field(body, "prompt", str, "")
    raw, suffix = field(body, "raw", bool, False), field(body, "suffix", str)
    if field(body, "context", list):
        raise ApiError(
            400,
            "'context' (an earlier reply's token ids) is not kept here; send the conversation to /api/chat",
            "context",
        )
    if body.get("template"):
        raise ApiError(
            400,
            "'template' (a Go template) is not read here, and the model's own chat template would apply: send "
            "the prompt already written out with raw: true, or leave 'template' out",
            "template",
        )
    b64 = field(body, "images", list, [])
    if not prompt and not b64 and suffix is None:  # Ollama's way to load (or, keep_alive 0, unload) the model
        empty = {**_head(state, body), "response": ""}
        return await load_or_unload(state, keep_alive_seconds(body.get("keep_alive")), empty)
    fim_stops: list[int] = []
    if suffix is not None:
        fim = fim_tokens(state.engine.tokenizer)
        if fim is None:
            raise ApiError(400, no_fim_message(state.engine.tokenizer), "suffix")
        built = await asyncio.to_thread(infill_prompt, state.text_tokenizer(), fim, prompt, suffix)
        ids, prompt_text = built.token_ids, ""
        fim_stops = list(fim.stop_token_ids)
        images = None
    elif raw:
        if b64:
            raise ApiError(400, "'images' go with a templated prompt; drop 'raw'", "raw")
        ids = await asyncio.to_thread(state.encode_text, prompt)
        prompt_text, images = prompt, None
    else:
        system = field(body, "system", str)
        turns = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt, "images": b64}
        ]
        messages, images = template_messages(_messages(turns))
        _takes(state, images)
        prompt_text, ids = await asyncio.to_thread(state.render, messages, None, _think(body))
    return await _run(state, request, body, ids, images, None, prompt_text, started, "generate", fim_stops)


async def _run(state, request, body, ids, images, tools, prompt_text, started, route, stop_ids=()):
    """Queue the request and answer in Ollama's shape (a stream of lines unless `stream` is false)."""
    alive = keep_alive_seconds(body.get("keep_alive"))
    fields = _sampling_fields(body)
    # num_predict left out, Ollama's -1 / -2, or more than fits: the reply may run to the context limit
    room = max(1, state.max_context - len(ids) - 1)
    wanted = field(fields, "max_tokens", int)
    fields["max_tokens"] = room if wanted is None or wanted < 0 else min(wanted, room)
    if stop_ids:
        fields["stop_token_ids"] = stop_ids
    grammar = openai_grammar(_response_format(body), tools, state.engine.tokenizer)
    params = sampling_params(state, fields, "max_tokens", 1, stop_list(fields), grammar=grammar)
    # where the tool list ends (engine/api/snapshot_hints.py)
    hints = await snapshot_hints.after_tools(state, tools, _think(body), prompt_text, ids)
    images = await preprocess_images(state, images) if images else None
    engine_stream = await start(state, ids, params, images, snapshot_hints=hints)
    await state.engine.keep_alive(alive)  # (once the request is in: one that is refused changes nothing)
    in_reasoning = prompt_text.rstrip().endswith("<think>")

    def piece(kind: str, value: Any) -> dict[str, Any]:
        """One streamed line's part: a text or thinking delta, or a whole tool call."""
        if route == "generate":
            return {"thinking" if kind == "reasoning" else "response": value}
        message: dict[str, Any] = {"role": "assistant", "content": value if kind == "text" else ""}
        if kind == "reasoning":
            message["thinking"] = value
        elif kind == "tool_call":
            message["tool_calls"] = [_call(value)]
        return {"message": message}

    if not field(body, "stream", bool, True):
        seen: list[float] = []  # when the first token came

        def token(out) -> None:
            if not seen and out.token_ids:
                seen.append(time.monotonic())

        (out,) = await collect_choices(state, [engine_stream], request, token)
        reasoning, content, calls = parse_reply(out.text, in_reasoning, tools)
        first = seen[0] if seen else time.monotonic()
        reply: dict[str, Any] = {**_head(state, body)}
        if route == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning:
                message["thinking"] = reasoning
            if calls:
                message["tool_calls"] = [_call(c) for c in calls]
            reply["message"] = message
        else:
            reply["response"] = content
            if reasoning:
                reply["thinking"] = reasoning
        return JSONResponse({**reply, **_done(out, started, first)})

    async def lines():
        parser = ReplyParser(in_reasoning, tools)
        first = out = None
        try:
            async for out, delta in engine_stream:
                failure = stream_failure(state, out)
                if failure is not None:
                    yield json.dumps({"error": failure}) + "\n"
                    return
                state.metrics.token(out)
                if first is None and out.token_ids:
                    first = time.monotonic()
                for kind, value in parser.feed(delta, final=out.finished):
                    yield json.dumps({**_head(state, body), **piece(kind, value), "done": False}) + "\n"
            state.metrics.finished(out)
            last = {
                **_head(state, body),
                **piece("text", ""),
                **_done(out, started, first or time.monotonic()),
            }
            yield json.dumps(last) + "\n"
        finally:
            engine_stream.abort()  # the client went away mid-stream: free its KV now

    def error_line(message: str) -> str:
        return json.dumps({"error": message}) + "\n"

    return StreamingResponse(guarded(lines(), error_line), media_type="application/x-ndjson")


@router.post("/api/embed")
async def embed(request: Request):
    state: ServerState = request.app.state.ninfer
    started = time.monotonic()
    body = await read_json(request)
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise ApiError(400, "'input' must be a non-empty string or an array of non-empty strings", "input")
    vectors, tokens = await _embeddings(state, request, texts, body)
    return {
        "model": _model(state, body),
        "embeddings": vectors,
        "total_duration": _ns(time.monotonic() - started),
        "load_duration": 0,
        "prompt_eval_count": tokens,
    }


@router.post("/api/embeddings")
async def embeddings(request: Request):
    """Ollama's older route: one `prompt`, one `embedding`."""
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    prompt = field(body, "prompt", str)
    if not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", "prompt")
    vectors, _ = await _embeddings(state, request, [prompt], body)
    return {"embedding": vectors[0]}


async def _embeddings(state, request, texts: list[str], body: dict) -> tuple[list[list[float]], int]:
    """Each text's embedding (normalized, the first `dimensions` values), and the tokens read; a text past
    the context is cut to it (`truncate`, default true) or refused."""
    tokenizer, limit = state.text_tokenizer(), state.max_context - 1
    prompts = await asyncio.to_thread(lambda: [tokenizer.encode(t) for t in texts])
    if any(len(p) > limit for p in prompts) and not field(body, "truncate", bool, True):
        raise ApiError(
            400, f"an input is longer than the context limit {limit}; send truncate: true", "input"
        )
    prompts = [p[:limit] for p in prompts]
    dimensions = field(body, "dimensions", int)
    alive = keep_alive_seconds(body.get("keep_alive"))
    outs = await pooled(state, prompts, request)
    await state.engine.keep_alive(alive)
    try:
        vectors = [truncated(out.embedding, dimensions, True) for out in outs]
    except NinferError as e:
        raise ApiError(400, str(e), "dimensions") from e
    return vectors, sum(len(p) for p in prompts)


def _messages(value: Any) -> Any:
    """Ollama's messages as OpenAI's: base64 `images` as image parts after the text, tool calls' object
    arguments as JSON text, an assistant's `thinking` as its reasoning, a tool reply's `tool_name` dropped
    (the template follows the order)."""
    if not isinstance(value, list):
        return value  # refused by template_messages, in its words
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            out.append(m)
            continue
        msg = {k: v for k, v in m.items() if k not in ("images", "tool_calls", "thinking", "tool_name")}
        if m.get("thinking") is not None and m.get("role") == "assistant":  # as chat completions' reasoning
            if not isinstance(m["thinking"], str):
                raise ApiError(400, f"messages[{i}].thinking must be a string", "messages")
            msg["reasoning_content"] = m["thinking"]
        images = m.get("images") or []
        if not isinstance(images, list) or not all(isinstance(b, str) for b in images):
            raise ApiError(400, f"messages[{i}].images must be an array of base64 strings", "messages")
        if images:
            text = m.get("content") or ""
            msg["content"] = [{"type": "text", "text": text}] + [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b}"}} for b in images
            ]
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise ApiError(400, f"messages[{i}].tool_calls must be an array", "messages")
            msg["tool_calls"] = [
                _openai_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)
            ]
        out.append(msg)
    return out


def _takes(state: ServerState, images) -> None:
    """Images to a model without its vision tower: refused before the template sees them."""
    if images.items:
        try:
            state.engine.llm.vision_or_raise()
        except NinferError as e:
            raise ApiError(400, str(e), "messages") from e


def _openai_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(
            400, f'{where} must be {{"function": {{"name": ..., "arguments": {{...}}}}}}', "messages"
        )
    args = fn.get("arguments", {})
    return {
        "type": "function",
        "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
    }


def _call(call) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": call.arguments}}


def _think(body: dict) -> dict[str, Any]:
    """`think`: true / false switches the template's thinking; low / medium / high is a reasoning effort."""
    think = body.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in THINK_LEVELS:
        return with_effort({}, think, "think")
    raise ApiError(400, f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}", "think")


def _sampling_fields(body: dict) -> dict[str, Any]:
    """The request's options as the sampling fields (and its model, which picks a LoRA adapter)."""
    options = field(body, "options", dict, {})
    model = body.get("model")
    # (Ollama's clients add the default tag to a bare name: an adapter is named without it)
    fields: dict[str, Any] = {"model": model.removesuffix(":latest") if isinstance(model, str) else model}
    for name, value in options.items():
        if name == "seed" and isinstance(value, int) and value < 0:
            continue  # Ollama's -1 (its default) is a random seed
        if name in OPTIONS:
            fields[OPTIONS[name]] = value
    return fields


def _response_format(body: dict) -> dict[str, Any]:
    """`format`: "json" (any JSON object), a JSON schema, or nothing."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}}
    raise ApiError(400, "'format' must be \"json\" or a JSON schema object", "format")


def _model(state: ServerState, body: dict) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else state.model_id


def _head(state: ServerState, body: dict) -> dict[str, Any]:
    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    return {"model": _model(state, body), "created_at": now}


def _done(out, started: float, first: float) -> dict[str, Any]:
    """The last line's counts and durations (nanoseconds): the prompt until the first token, then the rest."""
    end = time.monotonic()
    reason = "length" if out.finish_reason == "length" else "stop"
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": _ns(end - started),
        "load_duration": 0,
        "prompt_eval_count": len(out.prompt_token_ids),
        "prompt_eval_duration": _ns(first - started),
        "eval_count": len(out.token_ids),
        "eval_duration": _ns(end - first),
    }


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))
