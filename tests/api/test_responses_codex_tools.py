"""The Responses API's tool forms as Codex (0.150 on) sends them (engine/api/response_tools.py): an
`additional_tools` item first in every request's input (its code-mode `exec` in a namespace), `namespace`
tools, a client-run `tool_search` with `defer_loading` tools, and the `tool_search_call` /
`tool_search_output` items of a search done. Each was a 400 here, so Codex could not run at all."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

EXEC = {"type": "custom", "name": "exec", "description": "Run JavaScript that calls the tools."}
ADDITIONAL = {
    "type": "additional_tools",
    "role": "developer",
    "tools": [
        {"type": "namespace", "name": "functions", "description": "", "tools": [EXEC]},
        {"type": "namespace", "name": "collaboration", "description": "", "tools": []},
    ],
}
SEARCH_ISSUES = {
    "type": "function",
    "name": "search_issues",
    "description": "Search the issues",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    },
}
BROWSER = {
    "type": "function",
    "name": "open_page",
    "description": "Open a page in the browser",
    "parameters": {"type": "object", "properties": {"url": {"type": "string"}, "wait": {"type": "integer"}}},
    "defer_loading": True,
}
TOOLS = [
    {"type": "web_search"},  # (hosted ones Codex lists with every request: not offered, not refused)
    {"type": "image_generation"},
    {"type": "function", "name": "shell", "description": "Run a command", "parameters": {"type": "object"}},
    {"type": "namespace", "name": "mcp__github", "description": "GitHub", "tools": [SEARCH_ISSUES]},
    {"type": "tool_search", "execution": "client", "description": "Find more tools"},
    BROWSER,
]
ASK = {"role": "user", "content": "Find the flaky-test issue."}


def _call(name: str, **args) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _create(engine: ScriptedEngine, items: list, stream: bool = False):
    with RunningServer(engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        if not stream:
            return client.responses.create(model="m", input=items, tools=TOOLS).model_dump()
        with client.responses.stream(model="m", input=items, tools=TOOLS) as s:
            kinds = [e.type for e in s]
            final = s.get_final_response().model_dump()
        return {**final, "event_kinds": kinds}


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespaced_tool_is_seen_qualified_and_called_back_with_its_namespace(stream):
    engine = ScriptedEngine([_call("mcp__github.search_issues", query="flaky", limit=5)])
    reply = _create(engine, [ADDITIONAL, ASK], stream)
    (call,) = [i for i in reply["output"] if i["type"] == "function_call"]
    assert (call["name"], call.get("namespace")) == ("search_issues", "mcp__github")
    assert json.loads(call["arguments"]) == {"query": "flaky", "limit": 5}
    prompt = engine.prompts[0]
    for shown in (
        '"name": "exec"',
        '"name": "mcp__github.search_issues"',
        '"name": "tool_search"',
        '"shell"',
    ):
        assert shown in prompt, shown
    assert "open_page" not in prompt  # deferred until a tool search finds it
    assert "web_search" not in prompt and "image_generation" not in prompt


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_of_the_tool_search_is_a_tool_search_call_item(stream):
    engine = ScriptedEngine([_call("tool_search", query="browser")])
    reply = _create(engine, [ADDITIONAL, ASK], stream)
    (call,) = [i for i in reply["output"] if i["type"] == "tool_search_call"]
    assert call["arguments"] == {"query": "browser"} and call["execution"] == "client"
    assert call["status"] == "completed" and call["call_id"]
    if stream:
        assert "response.function_call_arguments.delta" not in reply["event_kinds"]


def test_the_tools_a_search_found_are_written_where_it_answered_and_called():
    engine = ScriptedEngine([_call("open_page", url="https://ci.example/flaky", wait=3)])
    found = {"type": "tool_search_output", "call_id": "call_ts", "execution": "client", "tools": [BROWSER]}
    history = [
        ADDITIONAL,
        ASK,
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "search_issues",
            "namespace": "mcp__github",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "issue 7: see CI"},
        {
            "type": "tool_search_call",
            "call_id": "call_ts",
            "execution": "client",
            "arguments": {"query": "browser"},
        },
        found,
    ]
    reply = _create(engine, history)
    (call,) = [i for i in reply["output"] if i["type"] == "function_call"]
    assert call["name"] == "open_page" and json.loads(call["arguments"]) == {
        "url": "https://ci.example/flaky",
        "wait": 3,
    }
    prompt = engine.prompts[0]
    head, _, after = prompt.partition("issue 7: see CI")
    assert (
        "open_page" not in head and "Open a page in the browser" in after
    )  # (the head, and its cache, kept)
    assert (
        "mcp__github.search_issues" in head.rpartition("Find the flaky-test issue.")[2]
    )  # the call as written


@pytest.mark.parametrize(
    "body,words",
    [
        ({"tools": [{"type": "namespace", "name": "x"}]}, "tools[0] (a namespace) needs"),
        (
            {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
            "tools[0].tools[0] must be a function or custom tool",
        ),
        (
            {"input": [{"type": "additional_tools", "role": "developer", "tools": 5}]},
            "input[0].tools must be an array",
        ),
        ({"tools": [SEARCH_ISSUES, SEARCH_ISSUES]}, "tools[1] is named 'search_issues', as another tool is"),
        (
            {"tools": [{"type": "local_shell"}]},
            "tools[0] is a 'local_shell' tool; this server takes function",
        ),
    ],
)
def test_tool_forms_that_cannot_be_served_are_refused_in_a_line(body, words):
    with RunningServer(ScriptedEngine([])) as server:
        sent = {"model": "m", "input": [ASK], **body}
        reply = httpx.post(f"{server.url}/v1/responses", json=sent, timeout=30)
    assert reply.status_code == 400 and words in reply.json()["error"]["message"], reply.text


@pytest.mark.parametrize("found", [[""], [None], [{"type": "function"}]])
def test_a_malformed_tool_search_output_is_a_400(found):
    with RunningServer(ScriptedEngine([])) as server:
        items = [ASK, {"type": "tool_search_output", "call_id": "c", "execution": "client", "tools": found}]
        reply = httpx.post(f"{server.url}/v1/responses", json={"model": "m", "input": items}, timeout=30)
    assert reply.status_code == 400 and "input[1].tools[0]" in reply.json()["error"]["message"], reply.text


def test_an_input_item_type_newer_than_this_server_is_passed_over():
    """A client that keeps its history sends an item again every turn: a 400 on a type this server does not
    know would fail the rest of the session. It is passed over; a type that is no string is still a 400."""
    engine = ScriptedEngine(["Done."])
    items = [ASK, {"type": "program", "id": "p1", "call_id": "c9", "code": "run()", "fingerprint": "f"}]
    with RunningServer(engine) as server:
        reply = httpx.post(f"{server.url}/v1/responses", json={"model": "m", "input": items}, timeout=30)
        bad = httpx.post(
            f"{server.url}/v1/responses", json={"model": "m", "input": [{"type": 5}]}, timeout=30
        )
    assert reply.status_code == 200, reply.text
    assert "run()" not in engine.prompts[0] and "Find the flaky-test issue." in engine.prompts[0]
    assert bad.status_code == 400
