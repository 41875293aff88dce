"""Snapshot hints: the places in a prompt where a hybrid model keeps its recurrent state because a client
will send that prefix again.

The prefix cache reuses any run of full pages without being told; a hybrid model (Gated DeltaNet layers)
also needs its recurrent state at the page it resumes from, which the scheduler snapshots at intervals, at
turn starts and where the prompt ends (Scheduler._prefill_snapshot_points). The routes add two kinds of
points where that guess misses:
* the end of the tool list: Qwen3.5's template writes the tools before the system prompt, so sessions of
  one agent share them even where their system prompts differ (a working directory, a date);
* Anthropic's `cache_control` marks (on a tool, a system block or a message's content block): the prompt
  up to and including the marked block, in the API's order (tools, system, messages), is a prefix the
  client means to send again; a mark between two system blocks splits a stable head from a per-session
  tail. On chat completions, the same marks as OpenRouter and LiteLLM take them for Anthropic models (on a
  tool, a message, or a message's content part: `find_openai`), which agents configured for those send.

Each point is found in the rendered prompt, whatever the template: the request cut there (the tools alone;
the request cut after the marked block) is rendered too, and the text the two renders share is the part
that does not depend on what follows; its length is counted in the prompt's tokens (Request.snapshot_hints;
the scheduler floors it to its page). A template that writes the system prompt first shares only the
turn's opening: no point. A cut the template will not render gives none either.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.api.errors import ApiError
from engine.tokenizer import Tokenizer

MAX_BREAKPOINTS = 4  # as Anthropic's API allows
TTLS = ("5m", "1h")
# where no message is left after a cut: chat templates want one (the shared text stops where it starts)
PLACEHOLDER = {"role": "user", "content": "."}


@dataclass(frozen=True)
class Breakpoint:
    where: str  # "tools[2]", "system[1]", "messages[3].content[0]": the marked block, as errors name it
    section: str  # "tools", "system" or "messages"
    index: int  # the tool's, system block's or message's index
    block: int = -1  # messages: the content block's index in the message (-1: the whole message)


def find(body: dict) -> list[Breakpoint]:
    """The request's breakpoints in prompt order, each `cache_control` checked (a 400 names a malformed one,
    and more than MAX_BREAKPOINTS marks). A block inside a tool_result's content marks the tool_result."""
    found: list[Breakpoint] = []
    marks = 0
    if "cache_control" in body:  # automatic caching: the last block, where the prompt's end is kept anyway
        _check(body["cache_control"], "cache_control")
    for section in ("tools", "system"):
        for i, item in _items(body.get(section)):
            if _marked(item, f"{section}[{i}]"):
                found.append(Breakpoint(f"{section}[{i}]", section, i))
                marks += 1
    for i, message in _items(body.get("messages")):
        for j, block in _items(message.get("content")):
            where = f"messages[{i}].content[{j}]"
            inner = block.get("content") if block.get("type") == "tool_result" else None
            n = _marked(block, where) + sum(_marked(b, f"{where}.content[{k}]") for k, b in _items(inner))
            if n:
                found.append(Breakpoint(where, "messages", i, j))
                marks += n
    _at_most(marks)
    return found


def find_openai(body: dict) -> list[Breakpoint]:
    """A chat completions request's breakpoints in prompt order: `cache_control` on a tool, on a message's
    content part, or on a message itself (its whole content), each checked as `find` checks them."""
    found: list[Breakpoint] = []
    for i, tool in _items(body.get("tools")):
        if _marked(tool, f"tools[{i}]"):
            found.append(Breakpoint(f"tools[{i}]", "tools", i))
    for i, message in _items(body.get("messages")):
        for j, part in _items(message.get("content")):
            if _marked(part, f"messages[{i}].content[{j}]"):
                found.append(Breakpoint(f"messages[{i}].content[{j}]", "messages", i, j))
        if _marked(message, f"messages[{i}]"):
            found.append(Breakpoint(f"messages[{i}]", "messages", i))
    _at_most(len(found))
    return found


def _at_most(marks: int) -> None:
    if marks > MAX_BREAKPOINTS:
        raise ApiError(
            400,
            f"at most {MAX_BREAKPOINTS} blocks may carry cache_control, and {marks} do; keep the marks on "
            "the prefixes you send again (the system prompt and tools, the latest messages) and drop the rest",
        )


def _items(value: Any) -> list[tuple[int, dict]]:
    """(index, item) for the objects of a list (anything else: none; the request's own checks name it)."""
    return [(i, v) for i, v in enumerate(value) if isinstance(v, dict)] if isinstance(value, list) else []


def _marked(block: dict, where: str) -> bool:
    if block.get("cache_control") is None:
        return False
    _check(block["cache_control"], f"{where}.cache_control")
    return True


def _check(mark: Any, where: str) -> None:
    if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
        raise ApiError(400, f'{where} must be {{"type": "ephemeral"}} (optionally with a ttl of 5m or 1h)')
    ttl = mark.get("ttl")
    if ttl is not None and ttl not in TTLS:
        raise ApiError(400, f"{where}.ttl must be '5m' or '1h' (got {ttl!r})")


def cut(body: dict, point: Breakpoint) -> dict:
    """The request cut after the marked block: what comes before it in the API's order and the block
    itself (PLACEHOLDER as the messages where none is left)."""
    out = {k: v for k, v in body.items() if k not in ("tools", "system", "messages")}
    if point.section == "tools":
        return {**out, "tools": body["tools"][: point.index + 1], "messages": [PLACEHOLDER]}
    if point.section == "system":
        return {
            **out,
            "tools": body.get("tools"),
            "system": body["system"][: point.index + 1],
            "messages": [PLACEHOLDER],
        }
    message = body["messages"][point.index]
    if point.block >= 0:
        message = {**message, "content": message["content"][: point.block + 1]}
    return {**body, "messages": [*body["messages"][: point.index], message]}


def hints(
    text: str, ids: list[int], renders: Iterable[Callable[[], str]], tokenizer: Tokenizer
) -> tuple[int, ...]:
    """The prompt positions (tokens of `ids`, the tokens of `text`) up to which each cut renders as the
    prompt does: `renders` render the cuts (an ApiError: the template will not; no point). Positions inside
    the prompt only (its end is kept anyway)."""
    positions = set()
    for render in renders:
        try:
            shared = shared_prefix(render(), text)
        except ApiError:
            continue
        position = token_position(text, ids, shared, tokenizer)
        if 0 < position < len(ids):
            positions.add(position)
    return tuple(sorted(positions))


def tool_list(state, tools: list | None, kwargs: dict[str, Any]) -> list[Callable[[], str]]:
    """The render of the tool list alone (a placeholder user turn after it), for `hints`; none without
    tools. `state`: the ServerState (render_text)."""
    return [lambda: state.render_text([PLACEHOLDER], tools, kwargs)] if tools else []


async def of_marks(
    state,
    body: dict,
    points: list[Breakpoint],
    render_cut: Callable[[dict], str],
    tools: list | None,
    kwargs: dict[str, Any],
    text: str,
    ids: list[int],
) -> tuple[int, ...]:
    """The hints where the prompt's tool list and each marked prefix (`points` of `body`, each cut rendered
    by `render_cut` as the route renders a request) end, in its tokens (in a thread)."""
    cuts = [functools.partial(render_cut, cut(body, p)) for p in points]
    renders = [*tool_list(state, tools, kwargs), *cuts]
    return await asyncio.to_thread(hints, text, ids, renders, state.text_tokenizer())


async def after_tools(
    state, tools: list | None, kwargs: dict[str, Any], text: str, ids: list[int]
) -> tuple[int, ...]:
    """The hint where the prompt's tool list ends (OpenAI's routes: the template's tools), for an engine
    that snapshots a recurrent state (in a thread; none for the others, which reuse any page anyway)."""
    if not tools or not state.engine.snapshots_enabled:
        return ()
    return await asyncio.to_thread(hints, text, ids, tool_list(state, tools, kwargs), state.text_tokenizer())


def shared_prefix(a: str, b: str) -> int:
    """The length of the longest prefix `a` and `b` share (a binary search over slices compared in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def token_position(text: str, ids: list[int], chars: int, tokenizer: Tokenizer) -> int:
    """How many of `text`'s tokens (`ids`) lie wholly within its first `chars` characters: counted from the
    tokens' byte lengths where they add up to the text's (byte-level BPE); else the tokens the prefix
    encodes to that `ids` starts with."""
    if not ids:
        return 0
    ends = np.cumsum(tokenizer.token_lengths[np.asarray(ids, dtype=np.int64)])
    if int(ends[-1]) == len(text.encode("utf-8")):
        return int(np.searchsorted(ends, len(text[:chars].encode("utf-8")), side="right"))
    head = np.asarray(tokenizer.encode(text[:chars], add_special_tokens=False), dtype=np.int64)
    n = min(len(head), len(ids))
    differ = np.flatnonzero(head[:n] != np.asarray(ids[:n], dtype=np.int64))
    # the prefix's last token may be cut short by the cut itself: it is not counted
    return int(differ[0]) if len(differ) else max(0, n - 1)
