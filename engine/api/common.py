"""Shared request handling: body parsing, field validation, sampling parameters, engine calls."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import Request

from engine.api.documents import PDF_BASE64, read_ahead
from engine.api.errors import ApiError, ContextExceeded
from engine.async_llm import AsyncStream
from engine.errors import DeviceMemoryBusy, EngineOverloaded, NinferError, PromptTooLong
from engine.parsers.reply import reply_parts
from engine.pooling import POOLED
from engine.request import LLAMA_CPP_FIELDS, RequestOutput, SamplingParams
from engine.vision.image import ImageInput

log = logging.getLogger("ninfer")

SHUTDOWN = "the server is shutting down; retry on another instance or after it restarts"
# a stream that has sent nothing for this long (a long prompt still prefilling) sends a keep-alive
KEEPALIVE_S = 15.0
SSE_KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: every client's parser skips it
# as the Anthropic API's own request limit: an agent's history carries its screenshots, base64, every turn
MAX_BODY_BYTES = 32 * 1024 * 1024


async def read_json(request: Request, allow_list: bool = False) -> dict[str, Any] | list:
    """The request's JSON body: an object (or, with `allow_list`, an array too)."""
    ctype = request.headers.get("content-type", "")
    if "json" not in ctype:
        raise ApiError(
            415, f"the body must be JSON (Content-Type: application/json), not '{ctype or 'none'}'"
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, _too_large(int(declared)))
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, _too_large(len(raw)))
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise ApiError(
            400, f"the body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from e
    if not isinstance(body, dict) and not (allow_list and isinstance(body, list)):
        raise ApiError(400, "the body must be a JSON " + ("object or array" if allow_list else "object"))
    if PDF_BASE64.encode() in raw:  # inline PDFs: read in a thread now, not on the event loop later
        state = getattr(request.app.state, "ninfer", None)
        await read_ahead(body, scans=state is not None and state.reads_images)
    return body


def _too_large(size: int) -> str:
    return (
        f"the body is {size} bytes; the limit is {MAX_BODY_BYTES} (32 MiB); send fewer or smaller images, or "
        "start a new conversation"
    )


def field(body: dict, name: str, kind: type | tuple, default: Any = None, required: bool = False) -> Any:
    """body[name] checked against `kind` (bool is never taken for a number)."""
    if name not in body or body[name] is None:
        if required:
            raise ApiError(400, f"'{name}' is required", name)
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ApiError(400, f"'{name}' must be {_kind_name(kinds)}, not a boolean", name)
    if float in kinds and isinstance(value, int):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number (got {value})", name)
    if not isinstance(value, kinds):
        raise ApiError(400, f"'{name}' must be {_kind_name(kinds)}, not {type(value).__name__}", name)
    return value


def _kind_name(kinds: tuple) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "an array",
        dict: "an object",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def is_token_id(value: Any) -> bool:
    """An integer (not a bool) of 0 or more."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def not_a_function_tool(index: int, kind: Any) -> ApiError:
    """The refusal of tools[index] when it is not a function tool (a built-in one the server would run)."""
    return ApiError(
        400,
        f"tools[{index}] is a '{kind}' tool; this server takes function tools (the client runs them)",
        "tools",
    )


def top_alternatives(logprobs: dict[int, float], top: int) -> list[tuple[int, float]]:
    """A position's `top` most likely (token id, logprob) pairs, most likely first."""
    return sorted(logprobs.items(), key=lambda tv: -tv[1])[:top]


_DEFAULT = {f.name: f.default for f in dataclasses.fields(SamplingParams)}


def sampling_params(
    state, body: dict, max_tokens_field: str, default_max_tokens: int, stop: list[str] | None, **extra: Any
) -> SamplingParams:
    """The body's sampling fields; those it leaves out take the served model's defaults
    (`--generation-config`), then ninfer's own."""
    defaults = state.sampling_defaults
    max_tokens = field(body, max_tokens_field, int, default_max_tokens)
    # ninfer's own field (Anthropic's thinking.budget_tokens comes in `extra`): reasoning tokens, then </think>;
    # a request that gives none takes the served default (--override-generation-config's thinking_budget)
    if extra.get("thinking_budget") is None:
        extra["thinking_budget"] = field(body, "thinking_budget", int, defaults.get("thinking_budget"))
    if field(body, "use_beam_search", bool, False):
        raise ApiError(
            400,
            "beam search is not served here; leave 'use_beam_search' out ('n' gives several samples)",
            "use_beam_search",
        )
    stop_ids = field(body, "stop_token_ids", list)
    if stop_ids is not None and not all(is_token_id(t) for t in stop_ids):
        raise ApiError(
            400, "'stop_token_ids' must be an array of token ids (integers >= 0)", "stop_token_ids"
        )
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=field(body, "min_tokens", int, 0),
            temperature=field(body, "temperature", float, defaults.get("temperature", 1.0)),
            top_p=field(body, "top_p", float, defaults.get("top_p", 1.0)),
            top_k=max(0, field(body, "top_k", int, defaults.get("top_k", 0))),
            min_p=field(body, "min_p", float, defaults.get("min_p", 0.0)),
            presence_penalty=field(body, "presence_penalty", float, 0.0),
            frequency_penalty=field(body, "frequency_penalty", float, 0.0),
            repetition_penalty=field(
                body, "repetition_penalty", float, defaults.get("repetition_penalty", 1.0)
            ),
            seed=field(body, "seed", int),
            ignore_eos=field(body, "ignore_eos", bool, False),
            logit_bias=_logit_bias(body),
            allowed_token_ids=field(body, "allowed_token_ids", list),
            bad_words=field(body, "bad_words", list, ()),
            stop=stop,
            include_stop_str_in_output=field(body, "include_stop_str_in_output", bool, False),
            stop_token_ids=stop_ids,
            skip_special_tokens=field(body, "skip_special_tokens", bool, True),
            **{
                name: field(body, name, kind, defaults.get(name, _DEFAULT[name]))
                for name, kind in LLAMA_CPP_FIELDS.items()
            },
            **state.adapter_for(body),
            **extra,
        )
    except NinferError as e:
        raise ApiError(400, str(e)) from e


def _logit_bias(body: dict) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} (JSON keys are strings)."""
    bias = field(body, "logit_bias", dict)
    if bias is None:
        return None
    out = {}
    for key, value in bias.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (isinstance(key, str) and key.strip().isdigit()) or not number:
            raise ApiError(
                400, f"'logit_bias' maps token ids to numbers (got {key!r}: {value!r})", "logit_bias"
            )
        out[int(key)] = float(value)
    return out


def truncated_prompt(body: dict, ids: list[int], max_context: int, reply_tokens: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: N keeps the prompt's last N tokens; -1 the most that leave room for
    `reply_tokens` within the context; absent, the prompt as it is."""
    keep = field(body, "truncate_prompt_tokens", int)
    if keep is None:
        return ids
    if keep == -1:
        keep = max(1, max_context - reply_tokens)
    if keep < 1:
        raise ApiError(
            400,
            f"'truncate_prompt_tokens' must be -1 (as much as fits) or 1 or more (got {keep})",
            "truncate_prompt_tokens",
        )
    return ids[-keep:]


async def start(
    state,
    ids: list[int],
    params: SamplingParams,
    images: list[ImageInput] | None = None,
    after: str | None = None,
    snapshot_hints: tuple[int, ...] = (),
) -> AsyncStream:
    """Queue a request; engine refusals become API errors (a full queue: 429, Retry-After). `images`: one
    for each image placeholder of `ids`, in order; `after`, `snapshot_hints`: as AsyncLLM.add_request."""
    max_context = state.max_context
    if params.max_tokens >= max_context:
        raise ApiError(
            400,
            f"max_tokens {params.max_tokens} is beyond the context limit {max_context} (--max-context); ask for "
            f"{max_context - 1} at most (the prompt takes its share of the context too)",
        )
    if len(ids) + 1 > max_context:  # (with images, the engine counts their tokens and refuses below)
        raise ContextExceeded(len(ids), max_context)
    try:
        stream = await state.engine.add_request(
            ids, params, images=images or None, after=after, snapshot_hints=snapshot_hints
        )
    except EngineOverloaded as e:
        raise ApiError(429, str(e), retry_after=1) from e
    except DeviceMemoryBusy as e:  # asleep, and the device's memory is someone else's now
        raise ApiError(503, str(e), retry_after=10) from e
    except PromptTooLong as e:
        raise ContextExceeded(e.tokens, e.limit, images=bool(images)) from e
    except NinferError as e:
        raise ApiError(400, str(e)) from e
    state.metrics.started(
        stream.request_id,
        images,
        structured=params.grammar is not None,
        adapters=params.adapter_mix,
        max_tokens=params.max_tokens,
    )
    return stream


async def collect(stream: AsyncStream, request: Request | None, seen=None) -> RequestOutput:
    """Wait for the whole output; a client that goes away aborts the request at once (`request` None: no
    client waits on it, a background response; cancelling the task aborts it). `seen(output)` is called as
    each part arrives (the metrics' time to first token and between tokens)."""

    async def watch() -> None:
        if request is None:
            return
        while not await request.is_disconnected():
            await asyncio.sleep(0.05)
        stream.abort()

    watcher = asyncio.create_task(watch())
    try:
        last = None
        async for item in stream:
            last = item[0]
            if seen is not None:
                seen(last)
        if last is None or not last.finished:  # aborted: the client went away (nobody reads this)
            raise ApiError(499, "the client closed the connection before the reply was complete")
        return last
    finally:
        watcher.cancel()
        stream.abort()


def stream_failure(state, out: RequestOutput) -> str | None:
    """Why a streamed reply stops before its end: it expired waiting for admission, the engine step running
    it failed, or the server's shutdown grace period is over; None while it goes on."""
    if out.finish_reason in ("expired", "error"):
        return out.error
    return SHUTDOWN if state.ending else None


async def guarded(events: AsyncIterator[str], error_event: Callable[[str], str]) -> AsyncIterator[str]:
    """A streamed reply's events; an exception once it has begun (a bug: the status line is sent) is logged
    and ends the stream with the protocol's error event, so the client hears why instead of a cut
    connection. The events' own cleanup has run by then (the engine's requests aborted)."""
    try:
        async for item in events:
            yield item
    except Exception as e:  # noqa: BLE001 - a bug; the client hears of it, the server goes on
        log.exception("internal error in a streamed reply")
        yield error_event(
            f"internal error ({type(e).__name__}) while streaming the reply; see the server log"
        )


async def until_failed(
    engine_stream: AsyncStream, failure: Callable[[RequestOutput], str | None]
) -> AsyncIterator[Any]:
    """A streamed reply's engine outputs, a None whenever they keep silent (the route sends a keep-alive),
    and, when `failure(output)` says the request failed, that event (a string) last. Leaving early (the
    client went away) aborts the request, so its KV is freed at once."""
    ticks = with_keepalive(engine_stream)
    try:
        async for item in ticks:
            event = failure(item[0]) if item is not None else None
            if event is not None:
                yield event
                return
            yield item
    finally:
        engine_stream.abort()
        await ticks.aclose()


async def written_unseen(
    state,
    engine_stream: AsyncStream,
    failure: Callable[[RequestOutput], str | None],
    keepalive: str,
    progress: Callable[[RequestOutput, str], list[str]] | None = None,
) -> AsyncIterator[str | RequestOutput]:
    """A request whose text the client does not see as it is written (a compaction's summary): the events
    to send while it runs (`keepalive` at each silence, `progress(output, delta)`'s, a failure's last), then
    its finished output as the last item, counted in the metrics (none when it failed or was left)."""
    out = None
    async for item in until_failed(engine_stream, failure):
        if isinstance(item, str):
            yield item
            return
        if item is None:
            yield keepalive
            continue
        out = item[0]
        state.metrics.token(out)
        for event in progress(*item) if progress is not None else ():
            yield event
    if out is not None and out.finished:
        state.metrics.finished(out)
        yield out


def check_failed(out: RequestOutput) -> None:
    """A request that ended without its reply: expired waiting for admission (503), or the engine step
    running it failed (500)."""
    if out.finish_reason == "expired":
        raise ApiError(503, out.error or "the request expired in the queue")
    if out.finish_reason == "error":
        raise ApiError(500, out.error or "the engine failed while running this request")


def now() -> int:
    return int(time.time())


async def collect_choices(
    state, streams: list[AsyncStream], request: Request | None, seen=None
) -> list[RequestOutput]:
    """Every stream's whole output (a choice each), each counted as finished; expiry said as a 503, a failed
    step as a 500; a client that goes away aborts them all. `seen(output)`: called as each part arrives,
    after the metrics."""

    def token(out: RequestOutput) -> None:
        state.metrics.token(out)
        if seen is not None:
            seen(out)

    try:
        outs = list(await asyncio.gather(*(collect(s, request, token) for s in streams)))
    finally:
        for stream in streams:
            stream.abort()
    for out in outs:
        state.metrics.finished(out)
    for out in outs:
        check_failed(out)
    return outs


async def pooled(
    state, prompts: list[list[int]], request: Request, shared_prefix: bool = False
) -> list[RequestOutput]:
    """Every prompt's output, at most --max-concurrency in the engine at once; the first refusal (or the
    client going away) ends them all. `shared_prefix`: the prompts begin alike (a reranker's pairs of one
    query), so the later ones wait until the first has run its prompt, then start from its pages."""
    gate = asyncio.Semaphore(max(1, state.engine.llm.engine_config.max_concurrency))
    first: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    async def one(index: int, ids: list[int]) -> RequestOutput:
        async with gate:  # the first task takes it first: tasks start in the order they were made
            if index == 0:
                stream: AsyncStream | None = None
                try:
                    stream = await start(state, ids, POOLED)
                finally:  # the first request's id, None when it was refused
                    first.set_result(stream.request_id if stream is not None else None)
            else:
                stream = await start(state, ids, POOLED, after=await first if shared_prefix else None)
            out = await collect(stream, request)
            check_failed(out)
            state.metrics.token(out)  # the time to the embedding, as a time to first token
            state.metrics.finished(out)
            return out

    tasks = [asyncio.create_task(one(i, ids)) for i, ids in enumerate(prompts)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


async def complete(
    state, stream: AsyncStream, request: Request | None, in_reasoning: bool, tools, max_calls=None, seen=None
):
    """A non-streamed reply: (output, reasoning, the answer's text pieces and tool calls in the order
    written: at most max_calls calls, one the reply ended inside with its `partial` arguments, as a stream
    sends it)."""
    (out,) = await collect_choices(state, [stream], request, seen)
    return (out, *reply_parts(out.text, in_reasoning, tools, max_calls, cut_calls=True))


def reasoning_tokens(tokenizer, out: RequestOutput, in_reasoning: bool) -> int:
    """The output's reasoning tokens: up to and with its first </think> (the prompt opened <think>, or the
    model did); all of them when the prompt opened <think> and the reply never closed it."""
    end = tokenizer.token_to_id("</think>") if tokenizer is not None else None
    if end is not None and end in out.token_ids:
        return out.token_ids.index(end) + 1
    return len(out.token_ids) if in_reasoning else 0


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def with_effort(kwargs: dict[str, Any], effort: Any, where: str) -> dict[str, Any]:
    """Template kwargs with a reasoning effort (OpenAI's `reasoning_effort` / `reasoning.effort`): none and
    minimal turn the template's thinking off, the others on, unless chat_template_kwargs already says."""
    if effort is None:
        return kwargs
    if effort not in EFFORTS:
        raise ApiError(400, f"'{where}' must be {', '.join(EFFORTS[:-1])} or {EFFORTS[-1]}", where)
    return {"enable_thinking": effort not in ("none", "minimal"), "reasoning_effort": effort, **kwargs}


T = TypeVar("T")


async def with_keepalive(items: AsyncIterable[T], seconds: float | None = None) -> AsyncIterator[T | None]:
    """`items` as they come, and None whenever `seconds` (KEEPALIVE_S) pass without one: the route then
    sends a keep-alive (an SSE comment; Anthropic's ping), so a proxy's or a client's idle timeout does not
    cut a stream whose prompt takes minutes to prefill. A task of its own reads `items` into a queue and
    a timer, moved on by each item, puts the Nones: no task or timeout a token. Leaving early cancels the
    reader (which ends `items`)."""
    interval = KEEPALIVE_S if seconds is None else seconds
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    end = object()
    timer: asyncio.TimerHandle | None = None

    def beat() -> None:
        nonlocal timer
        queue.put_nowait(None)
        timer = loop.call_later(interval, beat)

    async def read() -> None:
        nonlocal timer
        try:
            async for item in items:
                timer.cancel()
                timer = loop.call_later(interval, beat)
                queue.put_nowait((item,))
        except Exception as e:  # noqa: BLE001 - raised where the items are read
            queue.put_nowait(e)
        finally:
            timer.cancel()
            queue.put_nowait(end)

    timer = loop.call_later(interval, beat)
    reader = asyncio.ensure_future(read())
    try:
        while True:
            got = await queue.get()
            if got is end:
                return
            if isinstance(got, Exception):
                raise got
            yield None if got is None else got[0]
    finally:
        timer.cancel()
        reader.cancel()
        await asyncio.wait({reader})
