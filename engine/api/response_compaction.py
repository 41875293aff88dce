"""The Responses API's compaction: `POST /v1/responses/compact` (what OpenAI's own agents call when a
conversation nears the context limit) answers with the conversation to go on with: the latest user
messages as they were, then one `compaction` item standing for everything else. Here the served model
writes that item's summary (thinking off, tools not offered), and its `encrypted_content` is the summary in
base64 behind a `ninfer-summary-v1:` tag: nothing is encrypted on one's own server. A later request that
sends the item back (in `input`) gives the model the summary at that point; an item another server
compacted cannot be read here, and the model is told so rather than the request refused."""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.api.common import complete, field, now, read_json, sampling_params, start
from engine.api.errors import ApiError
from engine.api.images import preprocess_images
from engine.api.response_items import input_items
from engine.api.state import ServerState

router = APIRouter()

TAG = "ninfer-summary-v1:"
# the summary's length at most (and half the context), unless the request's max_output_tokens says less
SUMMARY_TOKENS = 4096
KEPT_USER_TOKENS = 20_000  # the latest user messages kept as they were, up to this many tokens
INSTRUCTION = (
    "Your context is nearly full, so this conversation is being compacted. Write a summary that lets you "
    "go on with the task from it alone: the user's goals and requirements, what has been done and found "
    "(files, commands, results, decisions and why), what is left to do and the next step, and anything "
    "else that must not be lost. Write only the summary."
)


def summary_item(summary: str) -> dict[str, Any]:
    encoded = base64.b64encode(summary.encode()).decode()
    return {"type": "compaction", "id": f"cmp_{uuid.uuid4().hex[:24]}", "encrypted_content": TAG + encoded}


def compaction_text(item: dict[str, Any]) -> str:
    """A `compaction` input item as the text the model reads in its place."""
    content = item.get("encrypted_content")
    if isinstance(content, str) and content.startswith(TAG):
        try:
            summary = base64.b64decode(content[len(TAG) :], validate=True).decode()
        except (binascii.Error, ValueError):
            summary = None
        if summary is not None:
            return f"Summary of the conversation before this point (it was compacted):\n{summary}"
    return (
        "(The conversation before this point was compacted by another server; its summary cannot be read "
        "here.)"
    )


def kept_user_messages(state: ServerState, given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items' user messages to keep as they were: the latest ones, up to KEPT_USER_TOKENS tokens
    (a message that would pass it is left out, and so are those before it), in their order."""
    kept: list[dict[str, Any]] = []
    budget = KEPT_USER_TOKENS
    tokenizer = state.text_tokenizer()
    for item in reversed(given):
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, list):
            text = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        else:
            text = content if isinstance(content, str) else ""
        budget -= len(tokenizer.encode(text, False))
        if budget < 0:
            break
        kept.append({"type": "message", "role": "user", "content": content})
    return input_items(kept[::-1])  # (content as input_text parts, ids)


@router.post("/v1/responses/compact")
async def compact(request: Request):
    from engine.api.responses import response_usage, responses_prompt  # (responses.py imports this module)

    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    if body.get("input") is None and body.get("previous_response_id") is None:
        raise ApiError(
            400, "'input' (or previous_response_id) is required: the conversation to compact", "input"
        )
    given = state.responses.resolve_references(body.get("input") or [])
    given = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(given, list):
        raise ApiError(400, "'input' must be a string or an array of items", "input")
    limit = min(
        field(body, "max_output_tokens", int) or SUMMARY_TOKENS, SUMMARY_TOKENS, state.default_max_tokens()
    )
    asked = {
        **body,
        "input": [*given, {"type": "message", "role": "user", "content": INSTRUCTION}],
        "tool_choice": "none",  # the summary is words, no calls
        "reasoning": {"effort": "none"},
        "truncation": "auto",  # a conversation too long for the context is summarised from what fits
        "max_output_tokens": limit,
    }
    p = responses_prompt(state, asked)
    in_reasoning = p.text.rstrip().endswith("<think>")
    params = sampling_params(state, asked, "max_output_tokens", limit, None)
    stream = await start(state, p.ids, params, await preprocess_images(state, p.images))
    out, _, summary, _ = await complete(state, stream, request, in_reasoning, None)
    output = [*kept_user_messages(state, given), summary_item(summary.strip())]
    return JSONResponse(
        {
            "id": f"resp_{uuid.uuid4().hex[:24]}",
            "object": "response.compaction",
            "created_at": now(),
            "output": output,
            "usage": response_usage(state, out, in_reasoning),
        }
    )
