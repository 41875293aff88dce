"""Anthropic's compaction on `/v1/messages`, both ways a client asks for it:

* `compaction: {"type": "summarize", "instructions"?}`: the request is a compaction. The reply is one
  `compaction` block (stop_reason `compaction`) that later requests send first in `messages`, in place
  of the messages it summarises. Not with `context_management`.
* `context_management.edits` `compact_20260112` (`trigger`: input tokens, default 150,000;
  `pause_after_compaction`; `instructions`): once the prompt (after the other edits) reaches the trigger,
  or would not fit the context beside the reply (compacted rather than refused), the conversation is
  compacted first; the reply is then written from the compacted context after the
  block, or, paused, the reply is the block alone (stop_reason `compaction`) and the client sends it back
  to have the turn go on.

The served model writes the summary (thinking off, tools not offered; `instructions` replace the default
request). The block's `content` is the summary; its `encrypted_content` (nothing is encrypted on one's own
server) carries the latest user messages as they were, so the block alone holds what the model goes on
from. In `messages`, the latest block with content stands for everything before it: those messages, and
the blocks before it in its own message, are not rendered; the model reads the block as the summary (one
with `content` null is a failed compaction and is passed over, as Anthropic's API does).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from engine.api.common import sampling_params, start
from engine.api.context_editing import COMPACT, PARAM
from engine.api.errors import ApiError
from engine.api.response_compaction import SUMMARY_TOKENS
from engine.api.state import ServerState
from engine.compaction import INSTRUCTION, latest_within, summary_text
from engine.parsers.reply import parse_reply
from engine.request import RequestOutput

DEFAULT_TRIGGER = 150_000
TAG = "ninfer-compaction-v1:"  # then base64 of JSON {"user": [the latest user messages' texts]}


@dataclass(frozen=True)
class Compaction:
    """A compaction asked for: `trigger` input tokens (None: the request is one), the summary request's
    `instructions`, and whether the reply stops after the block (`pause`)."""

    trigger: int | None
    instructions: str
    pause: bool

    def due(self, input_tokens: int, resumed: bool, fits: int) -> bool:
        """Whether to compact a prompt of `input_tokens`: past the trigger, or `fits` tokens or more (it would
        not fit the context beside the reply: compacted rather than refused); `resumed`: the request ends in
        a compaction block (a paused turn sent back to go on), which an edit does not compact again."""
        if self.trigger is None:
            return True
        return not resumed and input_tokens >= min(self.trigger, fits)


def _instructions(value: Any, where: str) -> str:
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"'{where}' must be a string")
    return value.strip() if value and value.strip() else INSTRUCTION


def requested(body: dict) -> Compaction | None:
    """The request's compaction: its `compaction` parameter or its compact_20260112 edit (None: neither);
    a malformed one is a 400 naming the field."""
    param = body.get("compaction")
    edits = (body.get(PARAM) or {}).get("edits") if isinstance(body.get(PARAM), dict) else None
    compacts = [(k, e) for k, e in enumerate(edits or []) if isinstance(e, dict) and e.get("type") == COMPACT]
    if param is not None:
        if body.get(PARAM) is not None:
            raise ApiError(
                400, f"'compaction' cannot be combined with '{PARAM}': send one of them", "compaction"
            )
        if not isinstance(param, dict) or param.get("type") != "summarize":
            raise ApiError(
                400, "'compaction' must be {\"type\": \"summarize\"} (with 'instructions' if you like)"
            )
        return Compaction(None, _instructions(param.get("instructions"), "compaction.instructions"), False)
    if not compacts:
        return None
    if len(compacts) > 1:
        raise ApiError(400, f"{PARAM}.edits: '{COMPACT}' may be listed once", PARAM)
    k, edit = compacts[0]
    where = f"{PARAM}.edits[{k}]"
    trigger = edit.get("trigger")
    value = DEFAULT_TRIGGER
    if trigger is not None:
        value = trigger.get("value") if isinstance(trigger, dict) else None
        kind = trigger.get("type") if isinstance(trigger, dict) else None
        if kind != "input_tokens" or isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiError(
                400,
                f'{where}.trigger must be {{"type": "input_tokens", "value": N}} with N a positive whole '
                "number",
                PARAM,
            )
    pause = edit.get("pause_after_compaction", False)
    if not isinstance(pause, bool):
        raise ApiError(400, f"{where}.pause_after_compaction must be true or false", PARAM)
    return Compaction(value, _instructions(edit.get("instructions"), f"{where}.instructions"), pause)


def summary_body(body: dict, compaction: Compaction, default_max_tokens: int) -> dict:
    """The request that writes the summary: the conversation, then the summary's instructions as the user's
    turn; thinking off, no tool calls, no other edits. Its length: SUMMARY_TOKENS at most, and a compaction
    request's (the parameter's: the summary is its reply) max_tokens."""
    limit = min(SUMMARY_TOKENS, default_max_tokens)
    if compaction.trigger is None and isinstance(body.get("max_tokens"), int):
        limit = max(1, min(limit, body["max_tokens"]))
    asked = {
        k: v
        for k, v in body.items()
        if k not in ("compaction", PARAM, "stream", "stop_sequences", "output_format")
    }
    output_config = {k: v for k, v in (body.get("output_config") or {}).items() if k != "format"}
    return {
        **asked,
        "messages": [*body["messages"], {"role": "user", "content": compaction.instructions}],
        "tool_choice": {"type": "none"},
        "thinking": {"type": "disabled"},
        "max_tokens": limit,
        **({"output_config": output_config} if output_config else {}),
    }


def has_words(message: dict) -> bool:
    """Whether a user message says something of its own (not only tool results): a turn to start from."""
    return bool(_text(message.get("content")))


def _text(content: Any) -> str:
    """A user message's own words: its text blocks (tool results and pictures left out)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def latest_user_texts(messages: list, count_tokens, budget: int) -> list[str]:
    """The latest user messages' words, up to `budget` tokens in all (a message that would pass it
    is left out, with those before it), in order; an earlier compaction's carried ones come before the
    messages after it."""
    texts: list[str] = []
    start = latest(messages)
    if start is not None:
        i, j = start
        texts = carried(messages[i]["content"][j])
        messages = messages[i + 1 :]
    texts += [
        t
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user" and (t := _text(m.get("content")))
    ]
    return latest_within(texts, count_tokens, budget)


def block(summary: str | None, user: list[str]) -> dict[str, Any]:
    carried_json = json.dumps({"user": user}).encode()
    return {
        "type": "compaction",
        "content": summary,
        "encrypted_content": TAG + base64.b64encode(carried_json).decode(),
    }


def carried(block: dict) -> list[str]:
    """The user messages a block of this server's carries (none for another server's)."""
    content = block.get("encrypted_content")
    if not isinstance(content, str) or not content.startswith(TAG):
        return []
    try:
        user = json.loads(base64.b64decode(content[len(TAG) :], validate=True)).get("user")
    except (binascii.Error, ValueError, AttributeError):
        return []
    return [u for u in user if isinstance(u, str)] if isinstance(user, list) else []


def block_text(block: dict, where: str) -> str:
    """A compaction block as the words the model reads in its place."""
    content = block.get("content")
    if not isinstance(content, str) or not content:
        raise ApiError(400, f"{where}.content must be the summary (a non-empty string) or null")
    return summary_text(content, carried(block))


def latest(messages: Any) -> tuple[int, int] | None:
    """Where the messages' latest compaction block with content is: (message, block); None: there is none."""
    if not isinstance(messages, list):
        return None
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content") if isinstance(messages[i], dict) else None
        if not isinstance(content, list):
            continue
        for j in range(len(content) - 1, -1, -1):
            b = content[j]
            if isinstance(b, dict) and b.get("type") == "compaction" and b.get("content") is not None:
                return i, j
    return None


def ends_with_block(messages: list) -> bool:
    """Whether the last message is an assistant turn that ends in a compaction block (a paused turn sent back
    to go on: not a prefill to continue)."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) and last.get("role") == "assistant" else None
    return (
        isinstance(content, list)
        and bool(content)
        and isinstance(content[-1], dict)
        and content[-1].get("type") == "compaction"
    )


@dataclass
class Summary:
    """A compaction's summary being written."""

    stream: Any  # its AsyncStream
    in_reasoning: bool

    def text(self, out: RequestOutput) -> str:
        return parse_reply(out.text, self.in_reasoning, None)[1].strip()


async def start_summary(state: ServerState, body: dict, compaction: Compaction, prepare) -> Summary:
    """Start writing the summary of the request's conversation; a conversation too long for the context
    with the summary is summarised from its latest user turns that fit (the fewest dropped). `prepare`:
    the messages route's (its rendered prompt, ids, tools, images, edits)."""
    asked = summary_body(body, compaction, state.default_max_tokens())
    limit = state.max_context - asked["max_tokens"]
    messages = asked["messages"]

    async def prepared(cut: int):  # (text, ids, images) without the first `cut` messages
        text, ids, _, images, _, _ = await prepare(state, {**asked, "messages": messages[cut:]})
        return text, ids, images, len(state.with_images(ids, images)) <= limit

    text, ids, images, fits = await prepared(0)
    starts = [i for i, m in enumerate(messages[:-1]) if i > 0 and m.get("role") == "user" and has_words(m)]
    if not fits and starts:  # the first start that fits, by binary search (else the last)
        best, lo, hi = None, 0, len(starts) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            tried = await prepared(starts[mid])
            if tried[3]:
                best, hi = tried, mid - 1
            else:
                lo = mid + 1
        text, ids, images, _ = best if best is not None else await prepared(starts[-1])
    params = sampling_params(state, asked, "max_tokens", asked["max_tokens"], None)
    stream = await start(state, ids, params, images)
    return Summary(stream, text.rstrip().endswith("<think>"))
