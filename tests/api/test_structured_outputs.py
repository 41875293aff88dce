"""Structured outputs over both protocols, through the official SDKs, on the embedded default model:
OpenAI response_format / structured_outputs / forced tool_choice, Anthropic output_config.format / forced
tool_choice; refusals one line each, and nothing left running after them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import anthropic
import httpx2 as httpx
import openai
import pytest
from conftest import CITY_SCHEMA as SCHEMA
from conftest import follows_city_schema as valid
from conftest import save_thinking_mtp_model, streamed_tool_calls
from scripted_engine import QWEN_STYLE_TEMPLATE
from server import RunningServer, qwen_style

from engine.api.openai import chat_tools
from engine.api.structured import openai_grammar
from engine.async_llm import AsyncLLM

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "maximum": 9}},
        "required": ["city", "days"],
    },
}
CLOCK = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
OAI_TOOLS = [{"type": "function", "function": f} for f in (WEATHER, CLOCK)]
CLAUDE_TOOLS = [{"name": f["name"], "input_schema": f["parameters"]} for f in (WEATHER, CLOCK)]
QUESTION = [{"role": "user", "content": "What is the weather in the capital of France?"}]
# the Qwen3.5 form of a call (the template that renders one decides the form the grammar forces)
XML_TEMPLATE = QWEN_STYLE_TEMPLATE.replace(
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}',
    "<function={{ c.function.name }}>\n</function>",
)


@pytest.fixture(scope="module")
def server():
    with RunningServer(qwen_style(AsyncLLM(max_concurrency=4))) as s:
        yield s


@pytest.fixture
def xml_form(server):
    json_form = server.engine.tokenizer
    server.engine.tokenizer = replace(json_form, chat_template=XML_TEMPLATE)
    yield
    server.engine.tokenizer = json_form


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


@pytest.fixture
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)


def test_openai_response_format_json_schema_plain_and_streamed(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    r = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=60, temperature=0, response_format=fmt
    )
    assert r.choices[0].finish_reason == "stop" and valid(r.choices[0].message.content)
    chunks = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=60, temperature=0, response_format=fmt, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    # json_object: any JSON object; the schema as JSON text is taken too
    r = oai.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=200, temperature=0, response_format={"type": "json_object"}
    )
    assert r.choices[0].finish_reason == "length" or isinstance(
        json.loads(r.choices[0].message.content), dict
    )
    assert r.choices[0].message.content.startswith("{")
    fmt["json_schema"]["schema"] = json.dumps(SCHEMA)
    r = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=60, response_format=fmt, seed=4)
    assert valid(r.choices[0].message.content)


def test_vllm_structured_outputs_and_guided_fields(oai):
    def ask(extra, endpoint="chat"):
        if endpoint == "chat":
            r = oai.chat.completions.create(
                model="m", messages=QUESTION, max_tokens=30, temperature=0, extra_body=extra
            )
            return r.choices[0].message.content
        return (
            oai.completions.create(
                model="m", prompt="The capital of France is", max_tokens=30, temperature=0, extra_body=extra
            )
            .choices[0]
            .text
        )

    assert ask({"structured_outputs": {"choice": ["sunny", "rainy"]}}) in ("sunny", "rainy")
    assert ask({"guided_choice": ["sunny", "rainy"]}) in ("sunny", "rainy")
    assert re.fullmatch(
        r"[A-Z][a-z]+, [0-9]{2} C", ask({"structured_outputs": {"regex": r"[A-Z][a-z]+, [0-9]{2} C"}})
    )
    assert ask({"structured_outputs": {"grammar": 'root ::= "It is " ("hot" | "cold")'}}) in (
        "It is hot",
        "It is cold",
    )
    assert valid(ask({"guided_json": SCHEMA}, "completions"))
    # llama-server's own fields, which it takes on its OpenAI routes too
    assert ask({"grammar": 'root ::= "It is " ("hot" | "cold")'}) in ("It is hot", "It is cold")
    assert valid(ask({"json_schema": SCHEMA}, "completions"))
    with pytest.raises(openai.BadRequestError, match="ask for one output format at a time"):
        ask({"json_schema": SCHEMA, "guided_json": SCHEMA})
    r = oai.completions.create(
        model="m",
        prompt="Answer:",
        max_tokens=40,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
    )
    assert valid(r.choices[0].text)


@pytest.mark.parametrize("form", ["json", "xml"])
def test_openai_forced_tool_choice(oai, request, form):
    if form == "xml":
        request.getfixturevalue("xml_form")
    r = oai.chat.completions.create(
        model="m",
        messages=QUESTION,
        tools=OAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    assert (
        call.function.name == "get_weather" and args["city"] in ("Paris", "Rome") and 0 <= args["days"] <= 9
    )
    r = oai.chat.completions.create(
        model="m",
        messages=QUESTION,
        tools=OAI_TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    calls = streamed_tool_calls(r)
    assert len(calls) == 1 and calls[0].function.name in ("get_weather", "get_time")


@pytest.mark.parametrize("form", ["json", "xml"])
def test_anthropic_forced_tool_choice_and_output_format(claude, request, form):
    if form == "xml":
        request.getfixturevalue("xml_form")
    m = claude.messages.create(
        model="m",
        max_tokens=80,
        messages=QUESTION,
        tools=CLAUDE_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    )
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    (use,) = m.content
    assert (
        use.name == "get_weather"
        and use.input["city"] in ("Paris", "Rome")
        and isinstance(use.input["days"], int)
    )
    with claude.messages.stream(
        model="m",
        max_tokens=80,
        messages=QUESTION,
        tools=CLAUDE_TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    ) as s:
        final = s.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1
    for field in ("output_config", "output_format"):
        fmt = {"type": "json_schema", "schema": SCHEMA}
        body = {"output_config": {"format": fmt}} if field == "output_config" else {"output_format": fmt}
        m = claude.messages.create(
            model="m", max_tokens=60, messages=QUESTION, extra_body={**body, "temperature": 0}
        )
        assert m.stop_reason == "end_turn" and valid(m.content[0].text)


@pytest.mark.parametrize(
    "path, body, words",
    [
        (
            "/v1/chat/completions",
            {"response_format": {"type": "yaml"}},
            "must be text, json_object or json_schema",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema"}},
            "must be an object with a 'schema'",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": "{nope"}}},
            "not valid JSON",
        ),
        ("/v1/chat/completions", {"tool_choice": "required"}, "has no 'tools'"),
        (
            "/v1/chat/completions",
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": OAI_TOOLS},
            "'nope', which is not among",
        ),
        (
            "/v1/chat/completions",
            {"tool_choice": "always", "tools": OAI_TOOLS},
            "must be none, auto, required",
        ),
        ("/v1/chat/completions", {"structured_outputs": {"regex": "(unclosed"}}, "does not compile"),
        ("/v1/chat/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one of"),
        ("/v1/chat/completions", {"structured_outputs": {"yaml": "a"}}, "(got yaml)"),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"grammar": "start: missing_rule"}},
            "does not compile",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "one output format at a time",
        ),
        ("/v1/completions", {"guided_choice": []}, "non-empty list"),
        ("/v1/messages", {"output_format": {"type": "xml"}}, 'must be {"type": "json_schema"'),
        ("/v1/messages", {"tool_choice": {"type": "tool"}, "tools": CLAUDE_TOOLS}, "needs the tool's 'name'"),
        (
            "/v1/messages",
            {
                "output_format": {"type": "json_schema", "schema": SCHEMA},
                "tool_choice": {"type": "any"},
                "tools": CLAUDE_TOOLS,
            },
            "one output format at a time",
        ),
    ],
)
def test_refusals_are_one_line(server, path, body, words):
    base = {"model": "m", "max_tokens": 8}
    base.update({"prompt": "Hi"} if path == "/v1/completions" else {"messages": QUESTION})
    r = httpx.post(server.url + path, json={**base, **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and "\n" not in error["message"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"


def test_nothing_left_running_and_counted(server):
    server.wait_idle()
    assert not server.engine.llm.has_unfinished_requests()
    metrics = httpx.get(f"{server.url}/metrics").text
    counted = next(ln for ln in metrics.splitlines() if ln.startswith("ninfer_structured_requests_total"))
    assert float(counted.split()[1]) >= 10  # the requests above that held their output to a grammar


def test_strict_tools_leave_text_free(oai, claude, server):
    """A strict tool in auto mode holds calls to the schema, not the text: the same greedy reply as without."""
    strict = [{"type": "function", "function": {**WEATHER, "strict": True}}]
    ask = dict(model="m", messages=QUESTION, max_tokens=24, temperature=0)
    plain = oai.chat.completions.create(tools=[{"type": "function", "function": WEATHER}], **ask)
    held = oai.chat.completions.create(tools=strict, **ask)
    assert held.choices[0].message.content == plain.choices[0].message.content
    grammar = openai_grammar({"tools": strict}, strict, server.engine.tokenizer)
    assert grammar is not None and "segment" in grammar
    assert openai_grammar({}, [{"type": "function", "function": WEATHER}], server.engine.tokenizer) is None
    tools = [{**CLAUDE_TOOLS[0], "strict": True}]
    m = claude.messages.create(
        model="m", max_tokens=24, messages=QUESTION, tools=tools, extra_body={"temperature": 0}
    )
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")


# (one or two items: this small model would add items for as long as it may)
LARK_FORMAT = 'start: "BEGIN\\n" item item? "END"\nitem: ("+" | "-") /[a-z]{1,8}/ "\\n"'


@pytest.mark.parametrize("form", ["json", "xml"])
def test_custom_tool_formats_hold_the_input_on_both_openai_routes(oai, request, form):
    """Codex-style freeform tools: forced, the call's input follows the tool's regex format in either call
    form, and its Lark format where calls are XML (Qwen3.5, Qwen3-Coder); in the JSON form a Lark format
    is told, not enforced."""
    if form == "xml":
        request.getfixturevalue("xml_form")
    regex = {"type": "grammar", "syntax": "regex", "definition": "[0-9]{3}-[a-z]{2}"}

    def forced_response_input(tool: dict, ask: str, tokens: int) -> str:
        forced = {"type": "custom", "name": tool["name"]}
        r = oai.responses.create(
            model="m", input=ask, tools=[tool], tool_choice=forced, max_output_tokens=tokens, temperature=0
        )
        (call,) = r.output
        assert call.type == "custom_tool_call", call
        return call.input

    code = {"type": "custom", "name": "code", "description": "A code", "format": regex}
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", forced_response_input(code, "Give me a code.", 40))
    chat_code = {"type": "custom", "custom": {"name": "code", "format": regex}}
    r = oai.chat.completions.create(
        model="m",
        messages=QUESTION,
        tools=[chat_code],
        max_tokens=40,
        temperature=0,
        tool_choice={"type": "custom", "custom": {"name": "code"}},
    )
    (call,) = r.choices[0].message.tool_calls
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", call.custom.input), call
    if form == "xml":
        ship = {
            "type": "custom",
            "name": "ship",
            "format": {"type": "grammar", "syntax": "lark", "definition": LARK_FORMAT},
        }
        patch = forced_response_input(ship, "Ship it.", 60)
        assert re.fullmatch(r"BEGIN\n([+-][a-z]+\n){1,2}END", patch), patch


def test_a_lark_format_in_the_json_call_form_leaves_auto_mode_free(server, request):
    """Codex sends apply_patch (a Lark format) with every request: where calls are JSON that format cannot
    bind, so it does not turn the reply into a grammar's; a regex format, or the XML form, does."""
    lark = {"type": "grammar", "syntax": "lark", "definition": LARK_FORMAT}
    regex = {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"}

    def grammar(fmt):
        body = {"tools": [{"type": "custom", "custom": {"name": "ship", "format": fmt}}]}
        return openai_grammar(body, chat_tools(body), server.engine.tokenizer)

    assert grammar(lark) is None and grammar(regex) is not None
    request.getfixturevalue("xml_form")
    assert grammar(lark).startswith("{")


@pytest.mark.parametrize(
    "definition, syntax, words",
    [
        ("start: missing_rule", "lark", "tools[0].format.definition is not a lark grammar llguidance reads"),
        ("[0-9", "regex", "tools[0].format.definition is not a regex grammar llguidance reads"),
    ],
)
def test_a_custom_format_that_does_not_compile_is_one_line(server, definition, syntax, words):
    fmt = {"type": "grammar", "syntax": syntax, "definition": definition}
    body = {"model": "m", "input": "hi", "tools": [{"type": "custom", "name": "t", "format": fmt}]}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory, thinking_tokenizer):
    path = save_thinking_mtp_model(tmp_path_factory.mktemp("think"), thinking_tokenizer, think=True)
    with RunningServer(AsyncLLM(path, max_concurrency=2)) as s:
        yield s


def test_thinking_budget_over_both_protocols(thinking_server):
    """Anthropic's thinking.budget_tokens (and the OpenAI routes' thinking_budget) end the reasoning after
    that many tokens: a random model's thinking block is exactly the budget."""
    tok = thinking_server.engine.tokenizer
    claude = anthropic.Anthropic(base_url=thinking_server.url, api_key="x", max_retries=0)
    oai = openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key="x", max_retries=0)
    ask = [{"role": "user", "content": "b c"}]
    m = claude.messages.create(
        model="m",
        max_tokens=40,
        messages=ask,
        thinking={"type": "enabled", "budget_tokens": 6},
        extra_body={"temperature": 0},
    )
    assert m.content[0].type == "thinking"
    assert len(tok.encode(m.content[0].thinking, add_special_tokens=False)) <= 6
    r = oai.chat.completions.create(
        model="m", messages=ask, max_tokens=40, temperature=0, extra_body={"thinking_budget": 6}
    )
    assert r.choices[0].message.reasoning_content == m.content[0].thinking
    # usage counts the reasoning: the budget's tokens and the </think> that ended them
    thought = r.usage.completion_tokens_details.reasoning_tokens
    assert 1 <= thought <= 7 and thought < r.usage.completion_tokens
    free = oai.chat.completions.create(model="m", messages=ask, max_tokens=12, temperature=0)
    assert free.choices[0].message.reasoning_content != m.content[0].thinking  # the budget did cut it
    if not free.choices[0].message.content:  # never closed: every token is reasoning
        assert free.usage.completion_tokens_details.reasoning_tokens == free.usage.completion_tokens == 12
    streamed = oai.chat.completions.create(
        model="m",
        messages=ask,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"thinking_budget": 6},
    )
    usage = [c.usage for c in streamed if c.usage is not None]
    assert usage[-1].completion_tokens_details.reasoning_tokens == thought
    adaptive = claude.messages.create(
        model="m", max_tokens=8, messages=ask, extra_body={"thinking": {"type": "adaptive"}, "temperature": 0}
    )
    assert adaptive.content[0].type == "thinking"  # Claude's newer form: thinking on, no budget
    shown = ({"type": "adaptive", "display": d} for d in ("omitted", "updates"))  # (updates: the beta's)
    for thinking in ({"type": "between_tools"}, *shown):
        newer = claude.messages.create(
            model="m", max_tokens=8, messages=ask, extra_body={"thinking": thinking, "temperature": 0}
        )
        assert newer.content[0].type == "thinking"  # (thinking on; sent either way)
    r = httpx.post(
        f"{thinking_server.url}/v1/messages",
        json={
            "model": "m",
            "max_tokens": 8,
            "messages": ask,
            "thinking": {"type": "enabled", "budget_tokens": 0},
        },
    )
    assert (
        r.status_code == 400 and "budget_tokens' must be a positive integer" in r.json()["error"]["message"]
    )


def test_a_served_thinking_budget_caps_requests_without_their_own(tmp_path, thinking_tokenizer):
    """--override-generation-config '{"thinking_budget": N}' (llama-server's --reasoning-budget N): a request
    that gives no budget reasons N tokens at most; one with its own budget keeps it."""
    path = save_thinking_mtp_model(tmp_path / "think", thinking_tokenizer, think=True)
    engine = AsyncLLM(path, max_concurrency=2, override_generation_config='{"thinking_budget": 4}')
    with RunningServer(engine) as server:
        tok = server.engine.tokenizer
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        ask = [{"role": "user", "content": "b c"}]

        def reasoning(**extra) -> str:
            r = oai.chat.completions.create(model="m", messages=ask, max_tokens=30, temperature=0, **extra)
            return r.choices[0].message.reasoning_content or ""

        capped = reasoning()
        assert 1 <= len(tok.encode(capped, add_special_tokens=False)) <= 4
        assert reasoning(extra_body={"thinking_budget": 10}) != capped  # its own budget
        adaptive = claude.messages.create(
            model="m",
            max_tokens=30,
            messages=ask,
            extra_body={"thinking": {"type": "adaptive"}, "temperature": 0},
        )
        assert adaptive.content[0].type == "thinking" and adaptive.content[0].thinking == capped
