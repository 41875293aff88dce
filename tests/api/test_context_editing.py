"""Anthropic's context editing on /v1/messages (engine/api/context_editing.py): past the trigger, every tool
use but the last `keep` has its result replaced by a placeholder before the prompt is rendered (those of
`exclude_tools` kept, inputs emptied with `clear_tool_inputs`), the response and the final streamed
message_delta say what was cleared, count_tokens previews it; below the trigger, or clearing fewer than
`clear_at_least` tokens, nothing changes; malformed edits are 400s naming the field."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api.context_editing import PLACEHOLDER

TOOLS = [
    {"name": name, "description": f"{name} a path", "input_schema": {"type": "object", "properties": {}}}
    for name in ("read_file", "memory")
]


def conversation(n: int = 5) -> list[dict]:
    """n tool rounds, each result a long file of its own, then a question."""
    messages = [{"role": "user", "content": "Look at the project."}]
    for i in range(n):
        name = "memory" if i == 1 else "read_file"
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": name, "input": {"path": f"f{i}.py"}}],
            }
        )
        body = f"contents of file {i}: " + " ".join(f"line{i}_{k}" for k in range(60))
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": body}]}
        )
    messages.append({"role": "user", "content": "What did you find?"})
    return messages


def body(edits, **extra) -> dict:
    return {
        "model": "m",
        "max_tokens": 16,
        "tools": TOOLS,
        "messages": conversation(),
        "context_management": {"edits": edits},
        **extra,
    }


CLEAR = {
    "type": "clear_tool_uses_20250919",
    "trigger": {"type": "input_tokens", "value": 100},
    "keep": {"type": "tool_uses", "value": 2},
}


@pytest.fixture
def server():
    engine = ScriptedEngine(["Found it."] * 8)
    with RunningServer(engine) as s:
        yield s, engine


def post(server, path, payload):
    r = httpx.post(f"{server.url}{path}", json=payload, timeout=30)
    return r.status_code, r.json()


def test_old_tool_results_are_cleared_past_the_trigger(server):
    s, engine = server
    status, plain = post(
        s, "/v1/messages/count_tokens", {k: v for k, v in body([CLEAR]).items() if k != "context_management"}
    )
    assert status == 200 and "context_management" not in plain
    status, counted = post(s, "/v1/messages/count_tokens", body([CLEAR]))
    assert counted["context_management"]["original_input_tokens"] == plain["input_tokens"]
    assert counted["input_tokens"] < plain["input_tokens"]
    status, untouched = post(s, "/v1/messages/count_tokens", body([]))
    assert untouched == {**plain, "context_management": {"original_input_tokens": plain["input_tokens"]}}
    status, reply = post(s, "/v1/messages", body([CLEAR]))
    assert status == 200
    (edit,) = reply["context_management"]["applied_edits"]
    assert edit == {
        "type": "clear_tool_uses_20250919",
        "cleared_tool_uses": 3,  # 5 uses, the last 2 kept
        "cleared_input_tokens": plain["input_tokens"] - counted["input_tokens"],
    }
    assert reply["usage"]["input_tokens"] == counted["input_tokens"]
    prompt = engine.prompts[-1]
    assert prompt.count(PLACEHOLDER) == 3
    assert "line3_59" in prompt and "line4_59" in prompt and "line0_5 " not in prompt
    assert '"path": "f0.py"' in prompt  # the calls' inputs stay


def test_excluded_tools_kept_inputs_cleared_and_the_stream_reports_it(server):
    s, engine = server
    edit = {**CLEAR, "exclude_tools": ["memory"], "clear_tool_inputs": True}
    r = httpx.post(f"{s.url}/v1/messages", json=body([edit], stream=True), timeout=30)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert (
        delta["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 2
    )  # t0 and t2; t1 is memory
    prompt = engine.prompts[-1]
    assert "line1_59" in prompt and prompt.count(PLACEHOLDER) == 2
    assert '"path": "f0.py"' not in prompt and '"path": "f1.py"' in prompt


def test_nothing_changes_below_the_trigger_or_when_too_little_would_go(server):
    s, engine = server
    high = {**CLEAR, "trigger": {"type": "input_tokens", "value": 100_000}}
    status, reply = post(s, "/v1/messages", body([high]))
    assert reply["context_management"] == {"applied_edits": []} and PLACEHOLDER not in engine.prompts[-1]
    greedy = {**CLEAR, "clear_at_least": {"type": "input_tokens", "value": 100_000}}
    status, reply = post(s, "/v1/messages", body([greedy]))
    assert reply["context_management"] == {"applied_edits": []} and PLACEHOLDER not in engine.prompts[-1]
    by_uses = {**CLEAR, "trigger": {"type": "tool_uses", "value": 4}}  # 5 uses: past it
    status, reply = post(s, "/v1/messages", body([by_uses]))
    assert reply["context_management"]["applied_edits"][0]["cleared_tool_uses"] == 3
    # the thinking edit, listed first, has nothing to clear (earlier thinking never reaches the prompt)
    thinking = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
    status, reply = post(s, "/v1/messages", body([thinking, CLEAR]))
    assert status == 200 and len(reply["context_management"]["applied_edits"]) == 1


@pytest.mark.parametrize(
    "edits, message",
    [
        ([{"type": "clear_everything"}], "edits[0].type must be 'clear_tool_uses_20250919', "),
        ([CLEAR, {"type": "clear_thinking_20251015"}], "'clear_thinking_20251015' must be listed first"),
        (
            [{**CLEAR, "keep": {"type": "tool_uses", "value": -1}}],
            'edits[0].keep must be {"type": "tool_uses"',
        ),
        ([{**CLEAR, "trigger": {"type": "turns", "value": 3}}], "trigger.type must be 'input_tokens' or"),
        ([{**CLEAR, "exclude_tools": "memory"}], "exclude_tools must be an array of tool names"),
        ([{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}], "N >= 1"),
    ],
)
def test_malformed_edits_are_refused(server, edits, message):
    s, _ = server
    status, reply = post(s, "/v1/messages", body(edits))
    assert status == 400 and message in reply["error"]["message"]
    status, reply = post(s, "/v1/messages", {**body([]), "context_management": []})
    assert status == 400 and "must be an object with an 'edits' array" in reply["error"]["message"]
