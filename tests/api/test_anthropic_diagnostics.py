"""Anthropic's cache diagnostics (engine/api/anthropic_diagnostics.py): with `diagnostics.previous_message_id`
the reply says why its prompt could not reuse the earlier request's prefix: the system prompt, the tools or an
earlier message changed, or `unavailable` when none of those did; null when the prefix was there to reuse
(messages only appended, cache_control marks moved); `previous_message_not_found` for an id not remembered."""

from __future__ import annotations

import anthropic
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

SYSTEM = "You are a coding agent working in a large repository. " * 12
TOOLS = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {}}}]
FIRST = [{"role": "user", "content": "Fix the failing test in parser.py, please. " * 6}]


@pytest.fixture
def claude():
    with RunningServer(ScriptedEngine(["Done."] * 8)) as server:
        yield anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)


def _send(client, previous, system=SYSTEM, tools=TOOLS, messages=FIRST, **extra):
    return client.messages.create(
        model="m",
        max_tokens=20,
        system=system,
        tools=tools,
        messages=messages,
        extra_body={"diagnostics": {"previous_message_id": previous}, **extra},
    )


def test_appended_messages_are_no_miss_and_each_change_is_named(claude):
    first = _send(claude, None)
    assert first.diagnostics is None
    turn = FIRST + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Now run it."}]
    marked = [
        *turn[:-1],
        {
            "role": "user",
            "content": [{"type": "text", "text": "Now run it.", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    second = _send(claude, first.id, messages=marked)
    assert second.diagnostics is None  # (appended, a cache_control mark added: the prefix was there)

    reasons = {}
    for kind, changed in (
        ("system_changed", {"system": SYSTEM + "Be brief."}),
        ("tools_changed", {"tools": TOOLS + [{"name": "Grep", "input_schema": {"type": "object"}}]}),
        (
            "messages_changed",
            {"messages": [{"role": "user", "content": "Something else entirely. " * 6}, *turn[1:]]},
        ),
    ):
        reply = _send(claude, second.id, **changed)
        reason = reply.diagnostics.cache_miss_reason
        reasons[kind] = reason.type
        assert reason.cache_missed_input_tokens > 0
    assert reasons == {k: k for k in reasons}
    # the same system, tools and messages, but tool_choice none keeps the tools out of the prompt
    reply = _send(claude, second.id, messages=marked, tool_choice={"type": "none"})
    assert reply.diagnostics.cache_miss_reason.type == "unavailable"


def test_an_id_not_remembered_is_named_so(claude):
    reply = _send(claude, "msg_nothing_like_it")
    assert reply.diagnostics.cache_miss_reason.type == "previous_message_not_found"


def test_no_diagnostics_asked_none_given(claude):
    reply = claude.messages.create(model="m", max_tokens=20, messages=FIRST)
    assert reply.diagnostics is None and "diagnostics" not in reply.model_dump(exclude_none=True)


def test_a_malformed_previous_id_is_a_400(claude):
    with pytest.raises(anthropic.BadRequestError, match="previous_message_id' must be"):
        claude.messages.create(
            model="m", max_tokens=5, messages=FIRST, extra_body={"diagnostics": {"previous_message_id": 7}}
        )
