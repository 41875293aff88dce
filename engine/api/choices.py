"""OpenAI's `n` (choices a prompt) and the text completions' several prompts: one engine request per
prompt and choice, choice index = prompt x n + choice. A prompt's later choices wait for its first to
run the prompt and start from its pages in the prefix cache (so a long prompt is computed once); each
samples on its own (a given seed becomes seed + choice)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

from engine.api.common import field, start
from engine.api.errors import ApiError
from engine.async_llm import AsyncStream
from engine.request import RequestOutput, SamplingParams

MAX_CHOICES = 64  # choices in one response (prompts x n)


def num_choices(body: dict, num_prompts: int = 1) -> int:
    """The body's `n`, checked."""
    n = field(body, "n", int, 1)
    if n < 1:
        raise ApiError(400, f"'n' must be at least 1 (got {n})", "n")
    if n * num_prompts > MAX_CHOICES:
        raise ApiError(
            400, f"{n * num_prompts} choices asked for (prompts x n); at most {MAX_CHOICES} a request", "n"
        )
    return n


async def start_choices(
    state,
    prompts: list[list[int]],
    params: SamplingParams,
    n: int,
    images=None,
    snapshot_hints: tuple[int, ...] = (),
) -> list[AsyncStream]:
    """Queue every prompt's n choices; all or none (a refusal aborts those already queued).
    `snapshot_hints`: the first prompt's (engine/api/snapshot_hints.py), for its first choice, which the
    others wait for."""
    streams: list[AsyncStream] = []
    # with prompt log-probabilities every choice computes its prompt itself (they take no cache hit)
    share = params.prompt_logprobs is None
    try:
        for i, ids in enumerate(prompts):
            first: AsyncStream | None = None
            for j in range(n):
                seeded = params if j == 0 or params.seed is None else replace(params, seed=params.seed + j)
                after = first.request_id if first is not None and share else None
                hints = snapshot_hints if i == j == 0 else ()
                stream = await start(state, ids, seeded, images, after=after, snapshot_hints=hints)
                first = first or stream
                streams.append(stream)
    except BaseException:
        for stream in streams:
            stream.abort()
        raise
    return streams


async def merged(streams: list[AsyncStream]) -> AsyncIterator[tuple[int, RequestOutput, str]]:
    """(choice index, output so far, new text) from every choice as they come; leaving early aborts all."""
    if len(streams) == 1:  # the common case, without the relay
        try:
            async for out, delta in streams[0]:
                yield 0, out, delta
        finally:
            streams[0].abort()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def relay(index: int, stream: AsyncStream) -> None:
        try:
            async for out, delta in stream:
                await queue.put((index, out, delta))
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            await queue.put((index, e, ""))
        finally:
            await queue.put((index, None, ""))

    tasks = [asyncio.create_task(relay(i, s)) for i, s in enumerate(streams)]
    running = len(streams)
    try:
        while running:
            index, out, delta = await queue.get()
            if out is None:
                running -= 1
            elif isinstance(out, BaseException):
                raise out
            else:
                yield index, out, delta
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.abort()
