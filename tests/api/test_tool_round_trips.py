"""Tool round trips through the official SDKs' typed objects, with a scripted engine double standing in for
the model (the protocol layer is under test): Qwen3 JSON and Qwen3.5 XML tool calls, streaming and not."""

from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest
from conftest import streamed_tool_calls
from scripted_engine import ScriptedEngine
from server import RunningServer

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
}
JSON_CALL = 'I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
XML_CALL = (
    "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
)
FINAL = "It is sunny in Paris."


@pytest.mark.parametrize("call_text", [JSON_CALL, XML_CALL], ids=["qwen3-json", "qwen3.5-xml"])
@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_round_trip(call_text, stream):
    engine = ScriptedEngine([call_text, FINAL])
    with RunningServer(engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        tools = [{"type": "function", "function": WEATHER}]
        if stream:
            chunks = list(
                client.chat.completions.create(model="m", messages=messages, tools=tools, stream=True)
            )
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = streamed_tool_calls(chunks)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            call_id, name, args = calls[0].id, calls[0].function.name, calls[0].function.arguments
            assert finish == ["tool_calls"]
        else:
            r = client.chat.completions.create(model="m", messages=messages, tools=tools)
            message = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls"
            content, (call,) = message.content, message.tool_calls
            call_id, name, args = call.id, call.function.name, call.function.arguments
        assert content == "I will look.\n" and "<tool_call>" not in content
        assert name == "get_weather" and json.loads(args) == {"city": "Paris", "days": 2}
        messages += [
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"},
        ]
        r = client.chat.completions.create(model="m", messages=messages, tools=tools)
        assert r.choices[0].message.content == FINAL and r.choices[0].finish_reason == "stop"
    second_prompt = engine.prompts[1]
    assert '"name": "get_weather", "arguments": {"city": "Paris", "days": 2}' in second_prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in second_prompt


@pytest.mark.parametrize("call_text", [JSON_CALL, XML_CALL], ids=["qwen3-json", "qwen3.5-xml"])
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_round_trip(call_text, stream):
    engine = ScriptedEngine([call_text, FINAL])
    with RunningServer(engine) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        tools = [
            {
                "name": WEATHER["name"],
                "description": WEATHER["description"],
                "input_schema": WEATHER["parameters"],
            }
        ]
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        if stream:
            with client.messages.stream(model="m", max_tokens=100, messages=messages, tools=tools) as s:
                message = s.get_final_message()
        else:
            message = client.messages.create(model="m", max_tokens=100, messages=messages, tools=tools)
        assert message.stop_reason == "tool_use"
        text, use = message.content
        assert text.type == "text" and text.text == "I will look.\n"
        assert (
            use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris", "days": 2}
        )
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": use.id,
                        "content": [{"type": "text", "text": "sunny, 21 C"}],
                    }
                ],
            },
        ]
        final = client.messages.create(model="m", max_tokens=100, messages=messages, tools=tools)
        assert final.content[0].text == FINAL and final.stop_reason == "end_turn"
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in engine.prompts[1]


def test_thinking_is_split_in_both_protocols():
    engine = ScriptedEngine(["Let me think.\n</think>\n\nFour.", "Let me think.\n</think>\n\nFour."])
    with RunningServer(engine) as server:
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        r = oai.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "2+2?"}],
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        assert r.choices[0].message.content == "Four."
        assert r.choices[0].message.model_extra["reasoning_content"] == "Let me think.\n"
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        with claude.messages.stream(
            model="m",
            max_tokens=50,
            messages=[{"role": "user", "content": "2+2?"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        ) as s:
            m = s.get_final_message()
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "Let me think.\n" and m.content[1].text == "Four."


def test_a_reply_cut_while_thinking_is_its_thinking_block_alone_both_ways():
    """The reply ends inside the reasoning: the thinking block alone (no empty text block), streamed or not."""
    engine = ScriptedEngine(["Let me think about"] * 2)
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        kwargs = dict(
            model="m",
            max_tokens=50,
            messages=[{"role": "user", "content": "2+2?"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        whole = claude.messages.create(**kwargs)
        with claude.messages.stream(**kwargs) as s:
            streamed = s.get_final_message()
        for m in (whole, streamed):
            assert [(b.type, b.thinking) for b in m.content] == [("thinking", "Let me think about")]


def test_anthropic_text_documents_are_read_and_others_refused_in_one_line():
    engine = ScriptedEngine([FINAL, FINAL])
    with RunningServer(engine) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        doc = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "The sky was green that day."},
            "title": "Notes",
            "context": "from the logbook",
        }
        question = {"type": "text", "text": "What colour was the sky?"}
        message = client.messages.create(
            model="m", max_tokens=20, messages=[{"role": "user", "content": [doc, question]}]
        )
        assert message.content[0].text == FINAL
        assert (
            "Title: Notes\nContext: from the logbook\nThe sky was green that day.\n\nWhat colour"
            in engine.prompts[0]
        )
        # a document of text blocks, inside a tool result
        blocks = {
            "type": "document",
            "source": {"type": "content", "content": [{"type": "text", "text": "page 1"}]},
        }
        messages = [
            {"role": "user", "content": "Read it."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [blocks]}]},
        ]
        client.messages.create(model="m", max_tokens=20, messages=messages)
        assert "page 1" in engine.prompts[1]
        pdf = {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
        }
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m", max_tokens=20, messages=[{"role": "user", "content": [pdf, question]}]
            )
        message = e.value.body["error"]["message"]
        assert message.startswith("messages[0].content[0] is not a readable PDF (")  # only its header
        assert "\n" not in message


def test_anthropic_search_results_are_read_as_text_and_mcp_servers_refused():
    """search_result blocks (a search's hits, in a user message or a tool result) reach the model as their
    title, source and text; `mcp_servers` (Anthropic's MCP connector) is refused: no server is connected."""
    engine = ScriptedEngine([FINAL, FINAL])
    hit = {
        "type": "search_result",
        "source": "https://example.com/sky",
        "title": "Sky colours",
        "content": [{"type": "text", "text": "The sky was green that day."}],
        "citations": {"enabled": True},
    }
    question = {"type": "text", "text": "What colour was the sky?"}
    with RunningServer(engine) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        client.messages.create(
            model="m", max_tokens=20, messages=[{"role": "user", "content": [hit, question]}]
        )
        assert (
            "Search result: Sky colours\nSource: https://example.com/sky\nThe sky was green that day.\n\nWhat"
            in engine.prompts[0]
        )
        messages = [
            {"role": "user", "content": "Search."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [hit]}]},
        ]
        client.messages.create(model="m", max_tokens=20, messages=messages)
        assert "Search result: Sky colours" in engine.prompts[1]
        for bad in ({**hit, "title": None}, {**hit, "content": "just text"}):
            with pytest.raises(anthropic.BadRequestError) as e:
                client.messages.create(
                    model="m", max_tokens=20, messages=[{"role": "user", "content": [bad]}]
                )
            assert "search_result" in e.value.body["error"]["message"]
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m",
                max_tokens=20,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"mcp_servers": [{"type": "url", "url": "https://mcp.example.com", "name": "x"}]},
            )
        assert e.value.body["error"]["message"].startswith("'mcp_servers': this server connects to no MCP")
        assert len(engine.prompts) == 2  # the refused ones ran nothing


def test_a_history_with_anthropics_server_tools_is_read_as_what_they_did():
    """Assistant turns answered by Anthropic's API hold its server tools' blocks (a router sends some turns
    there): each reaches the model as text in that turn (the search, its hits, a fetched page, a program's
    output, an error), the opaque parts left out; the same blocks in a user message are refused."""
    engine = ScriptedEngine([FINAL, FINAL])
    searched = [
        {"type": "text", "text": "Let me search."},
        {
            "type": "server_tool_use",
            "id": "srvtoolu_1",
            "name": "web_search",
            "input": {"query": "sky colour"},
        },
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_1",
            "content": [
                {
                    "type": "web_search_result",
                    "title": "Why is the sky blue?",
                    "url": "https://example.com/sky",
                    "encrypted_content": "EqgfCioIARgBIiQ3YTA",
                    "page_age": "2 days ago",
                }
            ],
        },
        {
            "type": "server_tool_use",
            "id": "srvtoolu_2",
            "name": "web_fetch",
            "input": {"url": "https://a.org"},
        },
        {
            "type": "web_fetch_tool_result",
            "tool_use_id": "srvtoolu_2",
            "content": {
                "type": "web_fetch_result",
                "url": "https://a.org",
                "content": {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "Rayleigh scattering."},
                },
            },
        },
        {
            "type": "bash_code_execution_tool_result",
            "tool_use_id": "srvtoolu_3",
            "content": {
                "type": "bash_code_execution_result",
                "stdout": "42\n",
                "stderr": "",
                "return_code": 0,
                "content": [],
            },
        },
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_4",
            "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"},
        },
        {
            "type": "advisor_tool_result",
            "tool_use_id": "srvtoolu_5",
            "content": {"type": "advisor_result", "text": "Cite the physics."},
        },
        {"type": "fallback", "to": {"model": "claude-x"}, "trigger": None},  # (a boundary: not rendered)
        {"type": "mcp_tool_listing", "mcp_server_name": "docs", "tools": []},
        {"type": "text", "text": "It is blue."},
    ]
    messages = [
        {"role": "user", "content": "What colour is the sky?"},
        {"role": "assistant", "content": searched},
        {"role": "user", "content": "And at night?"},
    ]
    with RunningServer(engine) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        client.messages.create(model="m", max_tokens=20, messages=messages)
        turn = engine.prompts[0].split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
        for seen in (
            "Let me search.",
            '[web_search {"query": "sky colour"}]',
            "- Why is the sky blue? <https://example.com/sky> (2 days ago)",
            "https://a.org\nRayleigh scattering.",
            "42\n(exit code 0)",
            "[web_search result]\nerror: max_uses_exceeded",
            "[advisor result]\nCite the physics.",
            "It is blue.",
        ):
            assert seen in turn, (seen, turn)
        assert "EqgfCioIARgBIiQ3YTA" not in turn
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m", max_tokens=20, messages=[{"role": "user", "content": [searched[1]]}]
            )
        assert "server_tool_use" in e.value.body["error"]["message"]
        bad = {**searched[1], "input": "sky"}
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m",
                max_tokens=20,
                messages=[*messages[:1], {"role": "assistant", "content": [bad]}, messages[2]],
            )
        assert "needs a string 'name' and an object 'input'" in e.value.body["error"]["message"]
        assert len(engine.prompts) == 1


def test_a_last_assistant_turn_is_continued_in_both_protocols():
    """Anthropic's prefill (a last assistant message) and vLLM's continue_final_message: the prompt ends
    where the assistant's text does, and the reply is the continuation."""
    engine = ScriptedEngine([" Paris.", " Paris.", " Paris."])
    prefill = "The capital of France is"
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        m = claude.messages.create(
            model="m",
            max_tokens=20,
            messages=[
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": prefill},
            ],
        )
        assert m.content[0].text == " Paris."
        assert engine.prompts[0].endswith("<|im_start|>assistant\n" + prefill)
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        turns = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": prefill}]
        r = oai.chat.completions.create(
            model="m",
            messages=turns,
            max_tokens=20,
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
        assert r.choices[0].message.content == " Paris." and engine.prompts[1] == engine.prompts[0]
        # without it, the assistant turn is history and a new one starts
        oai.chat.completions.create(model="m", messages=turns, max_tokens=20)
        assert engine.prompts[2].endswith(prefill + "<|im_end|>\n<|im_start|>assistant\n")
        for bad, words in (
            ([{"role": "user", "content": "Hi"}], "only a last assistant message with text can be continued"),
            (turns[:1] + [{"role": "assistant", "content": " "}], "only a last assistant message with text"),
        ):
            with pytest.raises(openai.BadRequestError, match=words):
                oai.chat.completions.create(
                    model="m", messages=bad, max_tokens=5, extra_body={"continue_final_message": True}
                )
        calls = [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]
        with pytest.raises(anthropic.BadRequestError, match="holds tool calls, which cannot be continued"):
            claude.messages.create(
                model="m", max_tokens=5, messages=[turns[0], {"role": "assistant", "content": calls}]
            )


TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_calls_turned_off_keep_the_first(stream):
    """parallel_tool_calls: false (OpenAI chat and Responses) / disable_parallel_tool_use (Anthropic) in
    auto mode: a reply with two calls gives the first; left on, both."""
    engine = ScriptedEngine([TWO_CALLS] * 6)
    with RunningServer(engine) as server:
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        ask = [{"role": "user", "content": "Weather in Paris and Rome?"}]
        tools = [{"type": "function", "function": WEATHER}]

        def openai_cities(parallel: bool) -> list[str]:
            kwargs = dict(model="m", messages=ask, tools=tools, max_tokens=100, parallel_tool_calls=parallel)
            if not stream:
                calls = oai.chat.completions.create(**kwargs).choices[0].message.tool_calls
                return [json.loads(c.function.arguments)["city"] for c in calls]
            chunks = list(oai.chat.completions.create(**kwargs, stream=True))
            calls = streamed_tool_calls(chunks)
            return [json.loads(c.function.arguments)["city"] for c in calls]

        assert openai_cities(True) == ["Paris", "Rome"] and openai_cities(False) == ["Paris"]
        anthropic_tools = [{"name": "get_weather", "input_schema": WEATHER["parameters"]}]
        choice = {"type": "auto", "disable_parallel_tool_use": True}
        kwargs = dict(model="m", max_tokens=100, messages=ask, tools=anthropic_tools, tool_choice=choice)
        if stream:
            with claude.messages.stream(**kwargs) as s:
                message = s.get_final_message()
        else:
            message = claude.messages.create(**kwargs)
        assert [b.input["city"] for b in message.content if b.type == "tool_use"] == ["Paris"]
        response_tools = [{"type": "function", **WEATHER}]
        r = oai.responses.create(model="m", input="Weather?", tools=response_tools, parallel_tool_calls=False)
        assert [json.loads(i.arguments)["city"] for i in r.output if i.type == "function_call"] == ["Paris"]


def test_chat_reasoning_effort_turns_thinking_on_and_off():
    """OpenAI's reasoning_effort on chat completions, as the Responses API's reasoning.effort: none and
    minimal turn the template's thinking off, the others on; chat_template_kwargs has the last word."""
    engine = ScriptedEngine([FINAL] * 4)
    with RunningServer(engine) as server:
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        ask = [{"role": "user", "content": "Hi"}]
        oai.chat.completions.create(model="m", messages=ask, max_tokens=5, reasoning_effort="high")
        oai.chat.completions.create(model="m", messages=ask, max_tokens=5, reasoning_effort="minimal")
        oai.chat.completions.create(
            model="m",
            messages=ask,
            max_tokens=5,
            reasoning_effort="none",
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        assert [p.endswith("<think>\n") for p in engine.prompts] == [True, False, True]
        with pytest.raises(openai.BadRequestError, match="'reasoning_effort' must be none, minimal, low"):
            oai.chat.completions.create(
                model="m", messages=ask, max_tokens=5, extra_body={"reasoning_effort": "max"}
            )


def test_anthropic_output_config_effort_reaches_the_template():
    """Anthropic's output_config.effort is the template's reasoning_effort (thinking left as `thinking`
    says); another value is a 400 naming the ones there are."""
    from dataclasses import replace

    engine = ScriptedEngine([FINAL] * 2)
    template = "{% for m in messages %}{{ m.content }}{% endfor %}|{{ reasoning_effort | default('unset') }}"
    engine.tokenizer = replace(engine.tokenizer, chat_template=template)
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        ask = [{"role": "user", "content": "Hi"}]
        claude.messages.create(
            model="m", max_tokens=5, messages=ask, extra_body={"output_config": {"effort": "max"}}
        )
        claude.messages.create(model="m", max_tokens=5, messages=ask)
        assert [p.rsplit("|", 1)[1] for p in engine.prompts] == ["max", "unset"]
        with pytest.raises(
            anthropic.BadRequestError, match="'output_config.effort' must be low, medium, high"
        ):
            claude.messages.create(
                model="m", max_tokens=5, messages=ask, extra_body={"output_config": {"effort": "extreme"}}
            )


def test_anthropic_defined_client_tools_get_their_schema_and_server_tools_are_refused():
    """Anthropic's bash and text-editor tools arrive as a bare type and name: the template hears them with
    the schema their input follows (max_characters told), a call comes back as a tool_use of that name;
    a server tool (web search) or a renamed or unknown tool type is a 400 naming it."""
    view = '<tool_call>\n{"name": "str_replace_based_edit_tool", "arguments": {"command": "view", "path": "/r/a.py"}}\n</tool_call>'
    engine = ScriptedEngine([view])
    editor = {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 900}
    bash = {"type": "bash_20250124", "name": "bash"}
    # Claude Code's advisor (a user picked an advisor model): not offered to the model, not refused
    advisor = {"type": "advisor_20260301", "name": "advisor", "model": "claude-opus-4-8"}
    ask = [{"role": "user", "content": "Show me a.py"}]
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        message = claude.messages.create(
            model="m", max_tokens=50, messages=ask, tools=[editor, advisor, bash]
        )
        (use,) = message.content
        assert message.stop_reason == "tool_use" and use.name == "str_replace_based_edit_tool"
        assert use.input == {"command": "view", "path": "/r/a.py"}
        (prompt,) = engine.prompts
        assert "advisor" not in prompt
        specs = [json.loads(line) for line in prompt.split("<tools>\n")[1].split("</tools>")[0].splitlines()]
        editor_spec, bash_spec = (s["function"] for s in specs)
        assert editor_spec["parameters"]["properties"]["command"]["enum"] == [
            "view",
            "create",
            "str_replace",
            "insert",
        ]
        assert editor_spec["parameters"]["required"] == ["command", "path"]
        assert "at most 900 characters" in editor_spec["description"]
        assert bash_spec["name"] == "bash" and "command" in bash_spec["parameters"]["properties"]
        refusals = [
            (
                {"type": "web_search_20250305", "name": "web_search"},
                "'web_search_20250305', a tool Anthropic's servers run",
            ),
            (
                {"type": "bash_20250124", "name": "shell"},
                "tools[1] of type 'bash_20250124' must be named 'bash'",
            ),
            (
                {"type": "computer_20250124", "name": "computer"},
                "tools[1] has type 'computer_20250124'; this server takes custom tools",
            ),
        ]
        for tool, message in refusals:
            with pytest.raises(anthropic.BadRequestError, match=re.escape(message)):
                claude.messages.create(model="m", max_tokens=5, messages=ask, tools=[editor, tool])
            with pytest.raises(anthropic.BadRequestError, match=re.escape(message)):
                claude.messages.count_tokens(model="m", messages=ask, tools=[editor, tool])
    assert len(engine.prompts) == 1


def test_deferred_tools_load_where_a_tool_reference_names_them():
    """Claude Code's tool search: a `defer_loading` tool stays out of the prompt's tool list; a tool_result
    holding a tool_reference to it reads as its definition at that point (the prompt before it unchanged,
    so the prefix cache still hits), and a call of it comes back typed by its schema. A reference to an
    undeclared tool is a 400; with Anthropic's tool-search server tool every tool is listed up front."""
    issue = {
        "name": "mcp__gh__create_issue",
        "description": "Open a GitHub issue",
        "input_schema": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "n": {"type": "integer"}},
        },
        "defer_loading": True,
    }
    search = {
        "name": "ToolSearch",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
    find = '<tool_call>\n{"name": "ToolSearch", "arguments": {"query": "github issue"}}\n</tool_call>'
    call = (
        '<tool_call>\n{"name": "mcp__gh__create_issue", "arguments": {"title": "Bug", "n": 3}}\n</tool_call>'
    )
    engine = ScriptedEngine([find, call, FINAL])
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "File a bug"}]
        first = claude.messages.create(model="m", max_tokens=50, messages=messages, tools=[search, issue])
        (use,) = first.content
        messages += [
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": use.id,
                        "content": [{"type": "tool_reference", "tool_name": "mcp__gh__create_issue"}],
                    }
                ],
            },
        ]
        second = claude.messages.create(model="m", max_tokens=50, messages=messages, tools=[search, issue])
        (created,) = second.content
        assert created.name == "mcp__gh__create_issue" and created.input == {"title": "Bug", "n": 3}
        unknown = [
            {**messages[-1]["content"][0], "content": [{"type": "tool_reference", "tool_name": "nope"}]}
        ]
        with pytest.raises(
            anthropic.BadRequestError, match="is a tool_reference to 'nope', which is not in tools"
        ):
            claude.messages.create(
                model="m",
                max_tokens=50,
                messages=[*messages[:-1], {"role": "user", "content": unknown}],
                tools=[search, issue],
            )
        regex_search = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
        claude.messages.create(
            model="m", max_tokens=50, messages=messages[:1], tools=[regex_search, search, issue]
        )
    first_prompt, second_prompt, searched_prompt = engine.prompts
    listed = first_prompt.split("</tools>")[0]
    assert '"ToolSearch"' in listed and "mcp__gh__create_issue" not in first_prompt
    assert second_prompt.startswith(first_prompt.split("<|im_start|>assistant")[0])
    response = second_prompt.split("<tool_response>\n")[1].split("</tool_response>")[0]
    loaded = json.loads(response.split("<tools>\n")[1].split("\n</tools>")[0])
    assert (
        loaded["function"]["name"] == "mcp__gh__create_issue"
        and loaded["function"]["parameters"] == issue["input_schema"]
    )
    assert "mcp__gh__create_issue" in searched_prompt.split("</tools>")[0]


PATCH = "*** Begin Patch\n*** Add File: a.py\n+print(1)\n*** End Patch"
PATCH_CALL = f"<tool_call>\n<function=apply_patch>\n<parameter=input>\n{PATCH}\n</parameter>\n</function>\n</tool_call>"
LARK = 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"'


@pytest.mark.parametrize("stream", [False, True])
def test_custom_tools_round_trip_in_the_responses_api(stream):
    """Codex's freeform apply_patch: the model sees a function of one string `input` (the grammar told in
    its description), its call comes back as a custom_tool_call whose input is the patch (streamed: the
    custom_tool_call_input events), and the call and its output go back into the next prompt."""
    engine = ScriptedEngine([PATCH_CALL, FINAL, PATCH_CALL])
    patch_tool = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files with a patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
    }
    with RunningServer(engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        ask = [{"role": "user", "content": "Add a.py"}]
        if stream:
            with client.responses.stream(model="m", input=ask, tools=[patch_tool]) as s:
                events = list(s)
                response = s.get_final_response()
            kinds = [e.type for e in events]
            added = next(e.item for e in events if e.type == "response.output_item.added")
            assert added.type == "custom_tool_call" and added.input == "" and added.status == "in_progress"
            # the patch streams as the model writes it, a few characters a delta
            deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
            assert len(deltas) > 10 and "".join(deltas) == PATCH
            assert "response.custom_tool_call_input.done" in kinds
        else:
            response = client.responses.create(model="m", input=ask, tools=[patch_tool])
        (call,) = [item for item in response.output if item.type != "message"]
        assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == PATCH
        follow_up = [
            *ask,
            {"type": "custom_tool_call", "call_id": call.call_id, "name": call.name, "input": call.input},
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done: A a.py"},
        ]
        final = client.responses.create(model="m", input=follow_up, tools=[patch_tool])
        assert final.output_text == FINAL
        forced = {"type": "custom", "name": "apply_patch"}  # held to a call of it, as a function would be
        again = client.responses.create(model="m", input=ask, tools=[patch_tool], tool_choice=forced)
        assert [item.type for item in again.output] == ["custom_tool_call"]
    listed = json.loads(engine.prompts[0].split("<tools>\n")[1].split("\n</tools>")[0])["function"]
    assert listed["parameters"]["required"] == ["input"] and LARK in listed["description"]
    assert (
        json.dumps(PATCH) in engine.prompts[1]
        and "<tool_response>\nDone: A a.py\n</tool_response>" in engine.prompts[1]
    )


@pytest.mark.parametrize("stream", [False, True])
def test_custom_tools_round_trip_in_chat_completions(stream):
    engine = ScriptedEngine([PATCH_CALL, FINAL, PATCH_CALL])
    patch_tool = {
        "type": "custom",
        "custom": {"name": "apply_patch", "description": "Edit files with a patch"},
    }
    with RunningServer(engine) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Add a.py"}]
        if stream:
            chunks = list(
                client.chat.completions.create(model="m", messages=messages, tools=[patch_tool], stream=True)
            )
            (call,) = streamed_tool_calls(chunks)
            # the SDK's delta type has no custom field: it stays the JSON object sent
            call_id, kind, custom = (
                call.id,
                call.type,
                openai.types.chat.chat_completion_message_custom_tool_call.Custom(**call.custom),
            )
        else:
            r = client.chat.completions.create(model="m", messages=messages, tools=[patch_tool])
            (call,) = r.choices[0].message.tool_calls
            call_id, kind, custom = call.id, call.type, call.custom
        assert kind == "custom" and custom.name == "apply_patch" and custom.input == PATCH
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "Done"},
        ]
        r = client.chat.completions.create(model="m", messages=messages, tools=[patch_tool])
        assert r.choices[0].message.content == FINAL
        bad = {
            "type": "custom",
            "custom": {
                "name": "apply_patch",
                "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"},
            },
        }
        with pytest.raises(openai.BadRequestError, match=r"tools\[0\].custom.format must be"):
            client.chat.completions.create(model="m", messages=messages[:1], tools=[bad])
    assert json.dumps(PATCH) in engine.prompts[1]


# Qwen3's rule in small: an assistant turn's reasoning is written for the turns after the last user message
KEEPS_LOOP_REASONING = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content %}"
    "<think>{{ m.reasoning_content }}</think>{%- endif %}{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "</tool_call>{%- endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


def test_reasoning_sent_back_reaches_the_template_in_every_protocol():
    """A tool loop's reasoning, sent back in each protocol's shape, is the assistant turn's reasoning_content
    (here written for the turns after the last user message, as Qwen's templates do); the earlier turn's is
    dropped by the template. A call sent back with its arguments cut short is read as far as whole."""
    from dataclasses import replace

    engine = ScriptedEngine(["ok"] * 8)
    engine.tokenizer = replace(engine.tokenizer, chat_template=KEEPS_LOOP_REASONING)
    with RunningServer(engine) as server:
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Par'},
        }
        for field in ("reasoning_content", "reasoning"):
            messages = [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", field: "R0"},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, field: "R1", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ]
            oai.chat.completions.create(
                model="m", messages=messages, tools=[{"type": "function", "function": WEATHER}]
            )
        for prompt in engine.prompts[-2:]:
            assert "<think>R1</think><tool_call>get_weather {}</tool_call>" in prompt and "R0" not in prompt

        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        tools = [{"name": "get_weather", "input_schema": WEATHER["parameters"]}]
        messages = [
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "R0", "signature": ""},
                    {"type": "text", "text": "Hello"},
                ],
            },
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "R1", "signature": ""},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
        ]
        claude.messages.create(model="m", max_tokens=20, messages=messages, tools=tools)
        assert '<think>R1</think><tool_call>get_weather {"city": "Paris"}</tool_call>' in engine.prompts[-1]
        assert "R0" not in engine.prompts[-1] and "opaque" not in engine.prompts[-1]
        # clear_thinking keeping 1 turn: the older turn's thinking goes (not in the prompt either way here)
        edit = {
            "edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]
        }
        r = claude.beta.messages.create(
            model="m",
            max_tokens=20,
            messages=messages,
            tools=tools,
            context_management=edit,
            betas=["context-management-2025-06-27"],
        )
        assert r.context_management.applied_edits[0].model_dump() == {
            "type": "clear_thinking_20251015",
            "cleared_thinking_turns": 1,
            "cleared_input_tokens": 0,
        }
        assert "<think>R1</think>" in engine.prompts[-1]

        items = [
            {"type": "message", "role": "user", "content": "Weather?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "R1"}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
        oai.responses.create(model="m", input=items, tools=[{"type": "function", **WEATHER}])
        assert '<think>R1</think><tool_call>get_weather {"city": "Paris"}</tool_call>' in engine.prompts[-1]

        import httpx2 as httpx

        ollama = [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "",
                "thinking": "R1",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "sunny"},
        ]
        r = httpx.post(
            f"{server.url}/api/chat", json={"model": "m", "messages": ollama, "stream": False}, timeout=30
        )
        assert r.status_code == 200, r.text
        assert '<think>R1</think><tool_call>get_weather {"city": "Paris"}</tool_call>' in engine.prompts[-1]
