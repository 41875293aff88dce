"""Anthropic's mid-conversation tool changes (`tool_addition` / `tool_removal` blocks): Claude Code loads
deferred and MCP tools mid-session with them, so from its second request on a session holds them. A
tool added by reference is written where it is added (the prompt before it unchanged); one defined inline
is declared for the request, its calls typed by its schema; a removal is a line in place; references into
Anthropic's MCP connector, and to tools nobody declared, are refused in one line. And a block type newer
than this server: read for its text, not refused."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

READ = {"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {}}}
DOCS = {
    "name": "mcp__docs__search",
    "description": "Search the docs",
    "input_schema": {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
    },
    "defer_loading": True,
}
CALL = (
    "<tool_call>\n<function=mcp__docs__search>\n<parameter=query>\nretry policy\n</parameter>\n"
    "<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>"
)


def _turns(added: dict) -> list[dict]:
    """A second request as Claude Code sends it: the first call's result, then the tool it adds."""
    return [
        {"role": "user", "content": "How do retries work here?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "see the docs"},
                {"type": "tool_addition", "tool": added},
            ],
        },
    ]


def _send(messages: list[dict], tools: list[dict], replies: int = 1) -> tuple[int, dict, list[str]]:
    engine = ScriptedEngine([CALL] * replies)
    with RunningServer(engine) as server:
        body = {"model": "m", "max_tokens": 200, "tools": tools, "messages": messages}
        reply = httpx.post(f"{server.url}/v1/messages", json=body, timeout=30)
    return reply.status_code, reply.json(), engine.prompts


def test_a_deferred_tool_added_by_reference_is_written_in_place_and_called():
    code, reply, prompts = _send(_turns({"type": "tool_reference", "name": DOCS["name"]}), [READ, DOCS])
    assert code == 200, reply
    head, _, after = prompts[0].partition("see the docs")
    assert "mcp__docs__search" not in head and "mcp__docs__search" in after  # (the head and its cache kept)
    (use,) = [b for b in reply["content"] if b["type"] == "tool_use"]
    assert use["name"] == "mcp__docs__search" and use["input"] == {"query": "retry policy", "limit": 5}
    assert reply["stop_reason"] == "tool_use"


def test_a_tool_defined_inline_is_declared_and_its_calls_typed():
    inline = {k: v for k, v in DOCS.items() if k != "defer_loading"}
    code, reply, prompts = _send(_turns({"type": "tool_definition", "definition": inline}), [READ])
    assert code == 200, reply
    assert "Search the docs" in prompts[0].partition("see the docs")[2]
    (use,) = [b for b in reply["content"] if b["type"] == "tool_use"]
    assert use["input"] == {"query": "retry policy", "limit": 5}


def test_a_removed_tool_is_said_in_place():
    messages = _turns({"type": "tool_reference", "name": DOCS["name"]})
    messages += [
        {"role": "assistant", "content": "Found it."},
        {
            "role": "user",
            "content": [
                {"type": "tool_removal", "tool": {"type": "tool_reference", "name": DOCS["name"]}},
                {"type": "text", "text": "Thanks."},
            ],
        },
    ]
    code, reply, prompts = _send(messages, [READ, DOCS])
    assert code == 200, reply
    assert "(The tool mcp__docs__search is no longer available.)" in prompts[0].rpartition("Found it.")[2]


@pytest.mark.parametrize(
    "added,words",
    [
        ({"type": "mcp_toolset_reference", "server_name": "docs"}, "Anthropic's MCP connector"),
        ({"type": "tool_reference", "name": "Nowhere"}, "which is not in tools"),
        ({"type": "tool_definition", "definition": {**READ}}, "a name another tool has"),
        ({"type": "something_else"}, "tool.type must be tool_reference or tool_definition"),
        ({"type": "tool_definition", "definition": "Read"}, "must be a tool object"),
    ],
)
def test_changes_that_cannot_be_served_are_refused_in_a_line(added, words):
    code, reply, _ = _send(_turns(added), [READ, DOCS], replies=0)
    assert code == 400 and words in reply["error"]["message"], reply


def test_a_block_type_newer_than_this_server_is_read_for_its_text_not_refused():
    """A client keeps a block in a session's history for good: a 400 on a type this server does not know
    would lock the session. Its text is read, the rest passed over; a known block in a message that
    cannot hold it is still a 400."""
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "note_2027", "text": "Prefer small diffs."},
                {"type": "text", "text": "Go."},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "hologram_2027", "data": "..."}, {"type": "text", "text": "Done."}],
        },
        {"role": "user", "content": "Next."},
    ]
    code, reply, prompts = _send(messages, [READ])
    assert code == 200, reply
    assert "Prefer small diffs." in prompts[0] and "hologram" not in prompts[0]
    wrong = [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "y"}]}]
    code, reply, _ = _send([{"role": "user", "content": "hi"}, *wrong], [READ], replies=0)
    assert code == 400 and "which an assistant message cannot hold" in reply["error"]["message"]
