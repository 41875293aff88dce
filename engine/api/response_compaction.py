"""The Responses API's compaction, three ways of asking for it:

* `POST /v1/responses/compact` (what OpenAI's own agents call when a conversation nears the context limit)
  answers with the conversation to go on with: the latest user messages as they were, then one
  `compaction` item standing for everything else.
* A `compaction_trigger` item, last in an ordinary create's input (Codex's in-band compaction): the
  response's one output item is a `compaction` item for the conversation before the trigger.
* `context_management: [{"type": "compaction", "compact_threshold": N}]` on a create: when the rendered
  prompt is N tokens or more (without N: when it would not fit the context beside the reply's
  max_output_tokens), the conversation is compacted first (its `compaction` item is the first output
  item) and the reply is written from the compacted context.

Here the served model writes the summary (thinking off, tools not offered). A `compaction` item's
`encrypted_content` is a tag and base64: nothing is encrypted on one's own server. The endpoint's item
(`ninfer-summary-v1:`) holds the summary; the other two's (`ninfer-compaction-v1:`, JSON) hold the summary
and the latest user messages as they were, so the item alone carries the conversation: items before it in
a later input (and a previous response's conversation) stand for what it summarises and are not rendered
again, as OpenAI's guide lets clients drop them. A later request that sends an item back gives the model its
text at that point; an item another server compacted cannot be read here, and the model is told so rather
than the request refused."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.api.common import complete, field, now, read_json, sampling_params, start
from engine.api.errors import ApiError
from engine.api.images import preprocess_images
from engine.api.response_items import input_items
from engine.api.state import ServerState
from engine.async_llm import AsyncStream
from engine.compaction import INSTRUCTION, latest_within, summary_text

router = APIRouter()

TAG = "ninfer-summary-v1:"  # /v1/responses/compact's item: the summary
WHOLE_TAG = "ninfer-compaction-v1:"  # a trigger's or a threshold's: JSON {summary, user: [texts]}
# the summary's length at most (and half the context), unless the request's max_output_tokens says less
SUMMARY_TOKENS = 4096
KEPT_USER_TOKENS = 20_000  # the latest user messages kept as they were, up to this many tokens


def kept_user_budget(max_context: int) -> int:
    """The latest user messages' tokens a compaction keeps as they were: KEPT_USER_TOKENS, and at most a
    quarter of the context (so the compacted conversation leaves room to go on)."""
    return min(KEPT_USER_TOKENS, max_context // 4)


def _item_id() -> str:
    return f"cmp_{uuid.uuid4().hex[:24]}"


def summary_item(summary: str) -> dict[str, Any]:
    encoded = base64.b64encode(summary.encode()).decode()
    return {"type": "compaction", "id": _item_id(), "encrypted_content": TAG + encoded}


def whole_item(summary: str, user: list[str], item_id: str | None = None) -> dict[str, Any]:
    """A compaction item that carries the conversation alone: the summary and the latest user messages."""
    encoded = base64.b64encode(json.dumps({"summary": summary, "user": user}).encode()).decode()
    return {"type": "compaction", "id": item_id or _item_id(), "encrypted_content": WHOLE_TAG + encoded}


def _decoded(content: Any, tag: str) -> str | None:
    if not isinstance(content, str) or not content.startswith(tag):
        return None
    try:
        return base64.b64decode(content[len(tag) :], validate=True).decode()
    except (binascii.Error, ValueError):
        return None


def _whole(item: Any) -> dict[str, Any] | None:
    """A whole item's {summary, user}; None for any other item (or one that does not read as one)."""
    text = _decoded(item.get("encrypted_content"), WHOLE_TAG) if isinstance(item, dict) else None
    try:
        whole = json.loads(text) if text is not None else None
    except ValueError:
        return None
    ok = (
        isinstance(whole, dict)
        and isinstance(whole.get("summary"), str)
        and isinstance(whole.get("user"), list)
    )
    return whole if ok and all(isinstance(u, str) for u in whole["user"]) else None


def carries_all_before(item: Any) -> bool:
    """Whether an input item is a compaction item of this server's that stands for everything before it."""
    return isinstance(item, dict) and item.get("type") == "compaction" and _whole(item) is not None


def compaction_text(item: dict[str, Any]) -> str:
    """A `compaction` input item as the text the model reads in its place."""
    whole = _whole(item)
    if whole is not None:
        return summary_text(whole["summary"], whole["user"])
    summary = _decoded(item.get("encrypted_content"), TAG)
    if summary is not None:
        return summary_text(summary)
    return (
        "(The conversation before this point was compacted by another server; its summary cannot be read "
        "here.)"
    )


def compact_threshold(body: dict, fits: int) -> int | None:
    """`context_management`'s compaction threshold in prompt tokens (None: not asked for); an entry without
    `compact_threshold` compacts a prompt that would not fit: `fits` tokens and more."""
    entries = body.get("context_management")
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise ApiError(400, "'context_management' must be an array of entries", "context_management")
    threshold = None
    for i, entry in enumerate(entries):
        where = f"context_management[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "compaction":
            kind = entry.get("type") if isinstance(entry, dict) else None
            raise ApiError(
                400, f"{where} has type {kind!r}; the one entry type is 'compaction'", "context_management"
            )
        value = entry.get("compact_threshold")
        if value is None:
            value = fits
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiError(
                400,
                f"{where}.compact_threshold must be a positive whole number of tokens",
                "context_management",
            )
        threshold = value if threshold is None else min(threshold, value)
    return threshold


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def kept_user_messages(state: ServerState, given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items' user messages to keep as they were: the latest ones, up to kept_user_budget tokens
    (a message that would pass it is left out, and so are those before it), in their order."""
    tokenizer = state.text_tokenizer()
    user = [
        {"type": "message", "role": "user", "content": item.get("content")}
        for item in given
        if item.get("type", "message") == "message" and item.get("role") == "user"
    ]
    kept = latest_within(
        user, lambda m: len(tokenizer.encode(_text(m["content"]), False)), kept_user_budget(state.max_context)
    )
    return input_items(kept)  # (content as input_text parts, ids)


@dataclass
class Summary:
    """A compaction's summary being written (its engine stream), for the conversation `given`."""

    stream: AsyncStream
    in_reasoning: bool
    given: list[dict[str, Any]]
    item_id: str

    def text(self, out) -> str:
        from engine.parsers.reply import parse_reply

        return parse_reply(out.text, self.in_reasoning, None)[1].strip()

    def whole_item(self, state: ServerState, out) -> dict[str, Any]:
        """The compaction item of a trigger or a threshold: the summary and the latest user messages."""
        given: list[dict[str, Any]] = []
        for item in self.given:  # an earlier compaction's user messages count as said before what follows
            whole = _whole(item) if isinstance(item, dict) and item.get("type") == "compaction" else None
            if whole is not None:
                given = [{"type": "message", "role": "user", "content": u} for u in whole["user"]]
            else:
                given.append(item)
        user = [_text(m["content"]) for m in kept_user_messages(state, given)]
        return whole_item(self.text(out), user, self.item_id)


def conversation_items(given: Any) -> list[dict[str, Any]]:
    """The input (references resolved) as a list of items: a string is one user message."""
    given = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(given, list):
        raise ApiError(400, "'input' must be a string or an array of items", "input")
    return given


async def start_summary(
    state: ServerState, body: dict, given: list[dict[str, Any]], the_reply: bool = True
) -> Summary:
    """Start writing the summary of the conversation: `body`'s previous response's and `given` (the input
    items, references resolved), with the instructions and tools `body` has. `the_reply`: the summary is the
    response (the endpoint's, a trigger's), so max_output_tokens bounds it too; a threshold's is not (that
    bounds the reply after it)."""
    from engine.api.responses import responses_prompt  # (responses.py imports this module)

    asked_tokens = field(body, "max_output_tokens", int) if the_reply else None
    limit = min(asked_tokens or SUMMARY_TOKENS, SUMMARY_TOKENS, state.default_max_tokens())
    asked = {
        **body,
        "input": [*given, {"type": "message", "role": "user", "content": INSTRUCTION}],
        "tool_choice": "none",  # the summary is words, no calls
        "reasoning": {"effort": "none"},
        "truncation": "auto",  # a conversation too long for the context is summarised from what fits
        "max_output_tokens": limit,
    }
    p = await asyncio.to_thread(responses_prompt, state, asked)
    in_reasoning = p.text.rstrip().endswith("<think>")
    params = sampling_params(state, asked, "max_output_tokens", limit, None)
    stream = await start(state, p.ids, params, await preprocess_images(state, p.images))
    return Summary(stream, in_reasoning, given, _item_id())


@router.post("/v1/responses/compact")
async def compact(request: Request):
    from engine.api.responses import response_usage  # (responses.py imports this module)

    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    if body.get("input") is None and body.get("previous_response_id") is None:
        raise ApiError(
            400, "'input' (or previous_response_id) is required: the conversation to compact", "input"
        )
    given = conversation_items(state.responses.resolve_references(body.get("input") or []))
    summary = await start_summary(state, body, given)
    out = (await complete(state, summary.stream, request, summary.in_reasoning, None))[0]
    output = [*kept_user_messages(state, given), summary_item(summary.text(out))]
    return JSONResponse(
        {
            "id": f"resp_{uuid.uuid4().hex[:24]}",
            "object": "response.compaction",
            "created_at": now(),
            "output": output,
            "usage": response_usage(state, out, summary.in_reasoning),
        }
    )
