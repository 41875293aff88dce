"""A tool call's arguments stream while the model writes them, in each protocol's own events, through the
official SDKs (a scripted engine double writes the reply a few characters at a time)."""

from __future__ import annotations

import json

import anthropic
import httpx2 as httpx
import openai
from conftest import streamed_tool_calls
from scripted_engine import ScriptedEngine
from server import RunningServer

WRITE = {
    "name": "write_file",
    "description": "Write a file",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "mode": {"type": "integer"},
        },
    },
}
CONTENT = "".join(f'def f{i}():\n    return "{i}é"\n\n' for i in range(20))
ARGS = {"path": "src/a.py", "content": CONTENT, "mode": 644}
XML = (
    "Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
    f"<parameter=content>\n{CONTENT}\n</parameter>\n<parameter=mode>\n644\n</parameter>\n</function>\n</tool_call>"
)
JSON = f'<tool_call>\n{{"name": "write_file", "arguments": {json.dumps(ARGS)}}}\n</tool_call>'
ASK = [{"role": "user", "content": "Write src/a.py"}]


def test_openai_streams_the_arguments_in_pieces():
    with RunningServer(ScriptedEngine([XML, JSON])) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        for _ in range(2):
            chunks = list(
                client.chat.completions.create(
                    model="m", messages=ASK, tools=[{"type": "function", "function": WRITE}], stream=True
                )
            )
            deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
            first = deltas[0]
            assert first.id and first.type == "function" and first.function.name == "write_file"
            assert first.function.arguments == "" and len(deltas) > 20  # the file's text, a piece at a time
            assert all(d.index == 0 and d.id is None for d in deltas[1:])
            (call,) = streamed_tool_calls(chunks)
            assert json.loads(call.function.arguments) == ARGS
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert finish == ["tool_calls"]


def test_anthropic_streams_input_json_deltas():
    with RunningServer(ScriptedEngine([XML])) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        tools = [{"name": "write_file", "input_schema": WRITE["parameters"]}]
        with claude.messages.stream(model="m", max_tokens=2000, messages=ASK, tools=tools) as s:
            events = list(s)
            message = s.get_final_message()
        starts = [e for e in events if e.type == "content_block_start"]
        assert [b.content_block.type for b in starts] == ["text", "tool_use"]
        assert starts[1].content_block.input == {} and starts[1].content_block.name == "write_file"
        partial = [
            e.delta.partial_json
            for e in events
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        assert len(partial) > 20 and json.loads("".join(partial)) == ARGS
        assert message.stop_reason == "tool_use" and message.content[1].input == ARGS


def test_responses_streams_function_call_argument_deltas():
    with RunningServer(ScriptedEngine([XML])) as server:
        body = {
            "model": "m",
            "input": "Write src/a.py",
            "tools": [{"type": "function", **WRITE}],
            "stream": True,
        }
        with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=30) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        added = [
            e
            for e in events
            if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
        ]
        assert (
            len(added) == 1
            and added[0]["item"]["arguments"] == ""
            and added[0]["item"]["status"] == "in_progress"
        )
        deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
        done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert (
            len(deltas) > 20
            and "".join(deltas) == done["arguments"]
            and json.loads(done["arguments"]) == ARGS
        )
        final = events[-1]["response"]["output"]
        call = next(i for i in final if i["type"] == "function_call")
        assert call["id"] == added[0]["item"]["id"] == done["item_id"] and call["status"] == "completed"


def test_a_call_cut_short_ends_without_its_text():
    """The reply ends inside a call (max_tokens): the streamed call stays as sent, no `<tool_call>` text
    follows it, and the reply does not finish as a tool call."""
    cut = XML[: XML.index("</parameter>\n<parameter=mode>") - 40]
    with RunningServer(ScriptedEngine([cut, cut])) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="m", messages=ASK, tools=[{"type": "function", "function": WRITE}], stream=True
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Writing it.\n" and "<tool_call>" not in text
        (call,) = streamed_tool_calls(chunks)
        assert call.function.name == "write_file" and call.function.arguments.startswith(
            '{"path": "src/a.py"'
        )
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
            "stop"
        ]
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        tools = [{"name": "write_file", "input_schema": WRITE["parameters"]}]
        with claude.messages.stream(model="m", max_tokens=2000, messages=ASK, tools=tools) as s:
            message = s.get_final_message()
        assert [b.type for b in message.content] == ["text", "tool_use"] and message.stop_reason == "end_turn"


def test_a_reply_without_streaming_is_what_the_stream_gives():
    """A call the reply ends inside is, without streaming too, the call as streamed (its arguments as far as
    written; Anthropic's input its whole members; a Responses item incomplete) rather than `<tool_call>`
    text; text after a call stays after it. Each protocol's stream and reply, assembled by its SDK, agree."""
    cut = JSON[: JSON.index('"mode"') + 8]  # ..., "mode": 6
    after = JSON + "\nDone."
    replies = [cut, after]
    tools = [{"type": "function", "function": WRITE}]
    with RunningServer(ScriptedEngine([cut] * 6 + [after] * 6)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        for reply in replies:
            whole = client.chat.completions.create(model="m", messages=ASK, tools=tools).choices[0]
            chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=tools, stream=True))
            (call,) = streamed_tool_calls(chunks)
            (got,) = whole.message.tool_calls
            assert (got.function.name, got.function.arguments) == (
                call.function.name,
                call.function.arguments,
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert (whole.message.content or "") == text == ("" if reply == cut else "\nDone.")
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert [whole.finish_reason] == finish == (["stop"] if reply == cut else ["tool_calls"])

            specs = [{"name": "write_file", "input_schema": WRITE["parameters"]}]
            message = claude.messages.create(model="m", max_tokens=2000, messages=ASK, tools=specs)
            with claude.messages.stream(model="m", max_tokens=2000, messages=ASK, tools=specs) as s:
                streamed = s.get_final_message()
            shape = [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in message.content]
            assert shape == [
                (b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in streamed.content
            ]
            assert message.stop_reason == streamed.stop_reason
            if reply == cut:
                assert shape == [("tool_use", None, {"path": "src/a.py", "content": CONTENT})]
                assert message.stop_reason == "end_turn"
            else:
                assert [kind for kind, _, _ in shape] == ["tool_use", "text"] and shape[1][1] == "\nDone."

            body = {"model": "m", "input": "Write src/a.py", "tools": [{"type": "function", **WRITE}]}
            items = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30).json()["output"]
            with httpx.stream("POST", f"{server.url}/v1/responses", json={**body, "stream": True}) as r:
                done = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")][-1]
            streamed_items = done["response"]["output"]
            assert [(i["type"], i.get("arguments"), i["status"]) for i in items] == [
                (i["type"], i.get("arguments"), i["status"]) for i in streamed_items
            ]
            if reply == cut:
                assert [(i["type"], i["status"]) for i in items] == [("function_call", "incomplete")]
                assert items[0]["arguments"] == call.function.arguments


def test_a_call_made_inside_an_unclosed_thinking_reaches_the_client():
    """The model called the tool before closing `</think>` and ended its turn: Claude Code gets the thinking
    and then the tool_use (stop_reason tool_use), OpenAI clients the reasoning and the tool call, rather
    than a turn with nothing to run."""
    thought = "I should write the file now.\n"
    with RunningServer(ScriptedEngine([thought + XML, thought + XML])) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        tools = [{"name": "write_file", "input_schema": WRITE["parameters"]}]
        thinking = {"type": "enabled", "budget_tokens": 1024}
        with claude.messages.stream(
            model="m", max_tokens=4000, messages=ASK, tools=tools, thinking=thinking
        ) as s:
            message = s.get_final_message()
        assert [b.type for b in message.content] == ["thinking", "tool_use"]
        assert message.stop_reason == "tool_use" and message.content[1].input == ARGS
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="m",
            messages=ASK,
            tools=[{"type": "function", "function": WRITE}],
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        choice = reply.choices[0]
        assert (
            choice.finish_reason == "tool_calls"
            and json.loads(choice.message.tool_calls[0].function.arguments) == ARGS
        )


# an MCP server's tool as FastMCP / Pydantic publish it: Optional fields are anyOf with null, a model
# parameter a $ref into $defs
EDIT = {
    "name": "edit_lines",
    "input_schema": {
        "type": "object",
        "$defs": {"Span": {"type": "object", "properties": {"start": {"type": "integer"}}}},
        "properties": {
            "path": {"type": "string"},
            "new_text": {"type": "string"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            "span": {"$ref": "#/$defs/Span"},
            "dry_run": {"type": ["boolean", "null"]},
        },
    },
}
# the text written holds the parser's own tags (the agent edits a tool-call parser), and the model leaves
# out </function>
NEW_TEXT = 'END = "</parameter>"\n# a value ends at </parameter> then </function>\n'
EDIT_XML = (
    "<tool_call>\n<function=edit_lines>\n<parameter=path>\nparser.py\n</parameter>\n"
    f"<parameter=new_text>\n{NEW_TEXT}\n</parameter>\n<parameter=limit>\n12\n</parameter>\n"
    '<parameter=span>\n{"start": 40}\n</parameter>\n<parameter=dry_run>\nfalse\n</parameter>\n</tool_call>'
)
EDIT_INPUT = {"path": "parser.py", "new_text": NEW_TEXT, "limit": 12, "span": {"start": 40}, "dry_run": False}


def test_mcp_schema_forms_type_the_values_and_a_value_may_hold_the_tags():
    """Claude Code with an MCP tool: `limit` arrives as 12 (not "12"), `span` as an object (not its JSON
    text), the new text whole with the `</parameter>` it holds, and the call ends though its `</function>`
    was left out; streamed and whole alike, and so through the OpenAI SDK."""
    with RunningServer(ScriptedEngine([EDIT_XML] * 3)) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        for stream in (True, False):
            if stream:
                with claude.messages.stream(model="m", max_tokens=2000, messages=ASK, tools=[EDIT]) as s:
                    message = s.get_final_message()
            else:
                message = claude.messages.create(model="m", max_tokens=2000, messages=ASK, tools=[EDIT])
            assert [b.type for b in message.content] == ["tool_use"] and message.stop_reason == "tool_use"
            assert message.content[0].input == EDIT_INPUT
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        fn = {"name": EDIT["name"], "parameters": EDIT["input_schema"]}
        chunks = list(
            client.chat.completions.create(
                model="m", messages=ASK, tools=[{"type": "function", "function": fn}], stream=True
            )
        )
        (call,) = streamed_tool_calls(chunks)
        assert json.loads(call.function.arguments) == EDIT_INPUT


def test_a_call_written_without_its_wrapper_reaches_the_client():
    """Qwen3.5 / 3.6 now and then write `<function=...>` without `<tool_call>` (keeping the orphan close): the
    agent gets the call, streamed or not, rather than the markup as text and a turn with nothing to run."""
    bare = "Writing it.\n" + XML.split("<tool_call>\n", 1)[1]  # (its `</tool_call>` kept)
    with RunningServer(ScriptedEngine([bare, bare])) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        tools = [{"name": "write_file", "input_schema": WRITE["parameters"]}]
        with claude.messages.stream(model="m", max_tokens=2000, messages=ASK, tools=tools) as s:
            message = s.get_final_message()
        assert [b.type for b in message.content] == ["text", "tool_use"] and message.stop_reason == "tool_use"
        assert message.content[0].text == "Writing it.\n" and message.content[1].input == ARGS
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="m", messages=ASK, tools=[{"type": "function", "function": WRITE}]
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and "<function" not in (choice.message.content or "")
        assert json.loads(choice.message.tool_calls[0].function.arguments) == ARGS
