"""The Responses API through the official openai SDK, on the embedded default model with a Qwen-style
template: text, streaming events, stored conversations, function tools, text.format, reasoning items."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from server import RunningServer, qwen_style

from engine.api.response_truncation import fit_by_dropping_turns
from engine.api.responses import _chat_messages
from engine.async_llm import AsyncLLM

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "capital": {"type": "boolean"}},
    "required": ["city", "capital"],
    "additionalProperties": False,
}
ASK = "What is the capital of France?"


@pytest.fixture(scope="module")
def server():
    with RunningServer(qwen_style(AsyncLLM(max_concurrency=2))) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def test_text_plain_and_streamed_with_the_events_in_order(client):
    r = client.responses.create(model="m", input=ASK, max_output_tokens=24, temperature=0)
    assert r.status == "completed" and "Paris" in r.output_text
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    with client.responses.stream(model="m", input=ASK, max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == r.output_text
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    # out of tokens: incomplete, said so
    short = client.responses.create(model="m", input=ASK, max_output_tokens=2)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"


def test_message_logprobs_when_included_plain_and_streamed(client):
    """include message.output_text.logprobs: each message token's logprob and its top_logprobs
    alternatives, on the output_text part, the text deltas and the done event; without it, none."""
    ask = dict(model="m", input=ASK, max_output_tokens=12, temperature=0, top_logprobs=2)
    include = ["message.output_text.logprobs"]
    r = client.responses.create(**ask, include=include)
    (part,) = r.output[0].content
    tokens = [lp.token for lp in part.logprobs]
    assert "".join(tokens) == part.text and 0 < len(tokens) <= r.usage.output_tokens
    assert r.top_logprobs == 2
    for lp in part.logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 2 and bytes(lp.bytes).decode() == lp.token
        assert lp.top_logprobs[0].token == lp.token  # greedy: the chosen token is the likeliest
        assert lp.top_logprobs[0].logprob >= lp.top_logprobs[1].logprob
    with client.responses.stream(**ask, include=include) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert deltas == [lp.token for lp in done.logprobs] == tokens
    assert [lp.token for lp in final.output[0].content[0].logprobs] == tokens
    assert [lp.logprob for lp in done.logprobs] == pytest.approx(
        [lp.logprob for lp in part.logprobs], abs=1e-4
    )
    plain = client.responses.create(**ask)
    assert plain.output[0].content[0].logprobs == [] and plain.output_text == r.output_text
    with client.responses.stream(**ask) as stream:
        assert not any(e.logprobs for e in stream if e.type == "response.output_text.delta")


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(
        model="m", input=ASK, instructions="Answer briefly.", max_output_tokens=16, temperature=0
    )
    second = client.responses.create(
        model="m", input="And of Italy?", previous_response_id=first.id, max_output_tokens=16, temperature=0
    )
    assert second.instructions is None  # instructions hold for one response, as OpenAI's do
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.retrieve(first.id)
    unstored = client.responses.create(model="m", input=ASK, max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_input_items_of_a_stored_response(client, server):
    given = [
        {"role": "system", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": ASK}],
            "id": "msg_mine",
        },
    ]
    r = client.responses.create(model="m", input=given, max_output_tokens=4, temperature=0)
    page = client.responses.input_items.list(r.id)
    assert [i.id for i in page.data][0] == "msg_mine"  # newest first by default
    assert [i.role for i in page.data] == ["user", "system"]
    assert page.data[1].content[0].type == "input_text" and page.data[1].content[0].text == "Be brief."
    assert page.first_id == "msg_mine" and not page.has_more
    asc = client.responses.input_items.list(r.id, order="asc", limit=1)
    assert [i.role for i in asc.data] == ["system"] and asc.has_more
    rest = client.responses.input_items.list(r.id, order="asc", after=asc.last_id)
    assert [i.id for i in rest.data] == ["msg_mine"] and not rest.has_more
    one = client.responses.create(model="m", input=ASK, max_output_tokens=4)
    (item,) = client.responses.input_items.list(one.id).data
    assert item.role == "user" and item.content[0].text == ASK and item.id.startswith("msg_")
    for query, words in (
        ("order=up", "'order' is 'up'"),
        ("limit=0", "'limit' must be"),
        ("after=x", "'after'"),
    ):
        got = httpx.get(f"{server.url}/v1/responses/{r.id}/input_items?{query}", timeout=30)
        assert got.status_code == 400 and words in got.json()["error"]["message"]
    assert httpx.get(f"{server.url}/v1/responses/resp_gone/input_items", timeout=30).status_code == 404


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_round_trip(client, stream):
    ask = dict(model="m", tools=[WEATHER], max_output_tokens=60, temperature=0)
    forced = dict(tool_choice="required", parallel_tool_calls=False)
    if stream:
        with client.responses.stream(input="Weather in Paris?", **ask, **forced) as s:
            kinds = [e.type for e in s]
            r = s.get_final_response()
        assert "response.function_call_arguments.done" in kinds
    else:
        r = client.responses.create(input="Weather in Paris?", **ask, **forced)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    after = client.responses.create(previous_response_id=r.id, input=[result], **ask)
    # the same conversation sent whole, without the stored one, renders the same prompt
    whole = client.responses.create(
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            result,
        ],
        store=False,
        **ask,
    )
    assert after.output_text == whole.output_text
    assert after.usage.input_tokens == whole.usage.input_tokens


def test_text_format_json_schema(client):
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}}
    r = client.responses.create(model="m", input=ASK, text=fmt, max_output_tokens=40, temperature=0)
    value = json.loads(r.output_text)
    assert value["city"] in ("Paris", "Rome") and isinstance(value["capital"], bool)


def test_reasoning_effort_turns_thinking_on_and_off(client):
    on = client.responses.create(
        model="m", input=ASK, reasoning={"effort": "high"}, max_output_tokens=12, temperature=0
    )
    # the prompt opened <think> and this small model never closes it: all of it is reasoning
    assert on.output[0].type == "reasoning" and on.output[0].content[0].text
    assert on.usage.output_tokens_details.reasoning_tokens > 0
    off = client.responses.create(
        model="m", input=ASK, reasoning={"effort": "none"}, max_output_tokens=12, temperature=0
    )
    assert [o.type for o in off.output] == ["message"]
    with client.responses.stream(
        model="m", input=ASK, reasoning={"effort": "high"}, max_output_tokens=12, temperature=0
    ) as s:
        kinds = [e.type for e in s]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds[-1] == ("response.completed" if on.status == "completed" else "response.incomplete")


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"input": [{"type": 5}]}, 400, "has type '5'"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 404, "input[0] refers to item 'msg_1'"),
        ({"input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role is 'robot'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            400,
            "input[0].content[0] names a file by id; this server fetches and keeps no files",
        ),
        ({"input": ASK, "previous_response_id": "resp_nope"}, 404, "no stored response 'resp_nope'"),
        (
            {"input": ASK, "background": True, "store": False},
            400,
            "a background response is stored to be polled",
        ),
        ({"input": ASK, "conversation": "conv_1"}, 400, "'conversation': this server keeps no conversations"),
        ({"input": ASK, "prompt": {"id": "pmpt_1"}}, 400, "'prompt': this server keeps no prompt templates"),
        ({"input": ASK, "truncation": "sometimes"}, 400, "'truncation' must be auto or disabled"),
        ({"input": ASK, "top_logprobs": 21}, 400, "'top_logprobs' must be between 0 and 20 (got 21)"),
        ({"input": ASK, "include": "message.output_text.logprobs"}, 400, "'include' must be"),
        ({"input": ASK, "reasoning": {"effort": "extreme"}}, 400, "'reasoning.effort' must be"),
        ({"input": ASK, "text": {"format": {"type": "yaml"}}}, 400, "'text.format.type' must be"),
        ({"input": ASK, "tool_choice": "required"}, 400, "has no 'tools'"),
        (
            {"input": ASK, "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
            400,
            "'nope'",
        ),
        ({}, 400, "'input' is required"),
        (
            {
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "reasoning", "summary": []},
                    {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/cat.png"}]},
                ],
                "instructions": "Be brief.",
            },
            400,
            "input[2].content[0]: image URLs are not fetched",
        ),
    ],
)
def test_refusals_are_one_line(server, body, status, words):
    r = httpx.post(
        f"{server.url}/v1/responses", json={"model": "m", "max_output_tokens": 4, **body}, timeout=30
    )
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert words in message and "\n" not in message


def test_truncation_auto_drops_the_earliest_exchanges_that_do_not_fit(server, client):
    """A conversation past the context: refused as too long by default; with truncation auto, the earliest
    whole exchanges are dropped until the prompt and max_output_tokens fit, and the reply comes."""
    limit = server.engine.llm.max_context
    chunk = "word " * (limit // 3)  # three exchanges of these are past the context, one fits
    items = []
    for i in range(4):
        items += [
            {"role": "user", "content": f"{i}: {chunk}"},
            {"role": "assistant", "content": f"noted {i}"},
        ]
    items.append({"role": "user", "content": ASK})
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input=items, max_output_tokens=8)
    r = client.responses.create(model="m", input=items, max_output_tokens=8, truncation="auto")
    assert r.truncation == "auto" and r.status in ("completed", "incomplete")
    assert limit // 3 < r.usage.input_tokens <= limit - 8  # some of the long exchanges are kept, not all


def test_item_reference_names_an_item_of_a_stored_response(client):
    """An item_reference input is the stored item it names (a response's input or output item), as if it
    were sent whole; the input_items listed for the new response are the items themselves."""
    asked = {"type": "message", "role": "user", "content": ASK, "id": "msg_asked"}
    first = client.responses.create(model="m", input=[asked], max_output_tokens=8, temperature=0)
    (answer,) = [item for item in first.output if item.type == "message"]
    follow = {"role": "user", "content": "And of Italy?"}
    whole = [asked, answer.model_dump(exclude_none=True), follow]
    by_reference = [
        {"type": "item_reference", "id": "msg_asked"},
        {"type": "item_reference", "id": answer.id},
        follow,
    ]
    sent = client.responses.create(model="m", input=whole, max_output_tokens=8, temperature=0)
    referred = client.responses.create(model="m", input=by_reference, max_output_tokens=8, temperature=0)
    assert referred.usage.input_tokens == sent.usage.input_tokens > first.usage.input_tokens
    assert referred.output_text == sent.output_text
    listed = client.responses.input_items.list(referred.id, order="asc").data
    assert [i.id for i in listed[:2]] == ["msg_asked", answer.id] and listed[1].role == "assistant"


HOSTED_HISTORY = [
    {"role": "user", "content": "Find the release notes and run the tests."},
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {
            "type": "search",
            "query": "ninfer release notes",
            "sources": [{"type": "url", "url": "https://n.example/rel"}],
        },
    },
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Found them."}]},
    {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "call_1",
        "status": "completed",
        "action": {"type": "exec", "command": ["make", "test"], "env": {}},
    },
    {
        "type": "local_shell_call_output",
        "id": "lso_1",
        "call_id": "call_1",
        "output": [{"stdout": "12 passed", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    },
    {
        "type": "mcp_list_tools",
        "id": "ml_1",
        "server_label": "git",
        "tools": [{"name": "log", "input_schema": {}}],
    },
    {"role": "user", "content": "Did they pass?"},
]


def test_hosted_tools_history_items_are_read_as_the_assistants_text(client):
    """Items of OpenAI's own tools (a conversation answered there before) reach the model as text in the
    assistant's turn instead of being refused: what was searched, run and what came back."""
    messages, origins = _chat_messages(HOSTED_HISTORY)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # the tools and words: one turn
    assert origins == ["input[0]", "input[1]", "input[6]"]
    turn = "".join(part["text"] for part in messages[1]["content"])
    assert turn.startswith(
        "[web_search_call]\nquery: ninfer release notes\n- <https://n.example/rel>\nFound them."
    )
    for said in ("[local_shell_call]\nmake test", "12 passed\n(exit code 0)", "[mcp_list_tools]\ngit: log"):
        assert said in turn
    odd = [  # fields of other shapes than OpenAI writes: read as far as they go, never a 500
        {"type": "mcp_list_tools", "tools": 5},
        {"type": "web_search_call", "action": 5},
        {"type": "local_shell_call_output", "output": [5, {"stdout": {}}]},
        {"type": "file_search_call", "queries": "q", "results": [{"filename": 5}, 7]},
        {"type": "code_interpreter_call", "outputs": {"logs": 1}},
    ]
    (turn,) = _chat_messages(odd)[0]
    assert turn["role"] == "assistant" and "[mcp_list_tools]" in turn["content"]
    r = client.responses.create(model="m", input=HOSTED_HISTORY, max_output_tokens=4, temperature=0)
    bare = client.responses.create(
        model="m", input=[HOSTED_HISTORY[0], HOSTED_HISTORY[-1]], max_output_tokens=4, temperature=0
    )
    assert r.usage.input_tokens > bare.usage.input_tokens + 20


def test_fit_by_dropping_turns_keeps_whole_exchanges_and_the_most_that_fit():
    turns = [
        {"role": "user", "content": "a" * 10},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "b" * 10},
        {"role": "assistant", "content": "c" * 10},
        {"role": "user", "content": "d" * 10},
        {"role": "assistant", "content": "e" * 10},
        {"role": "user", "content": "f" * 10},
    ]
    cuts = []

    def render(cut):  # a token per character of content
        cuts.append(cut)
        return None, "", [0] * sum(len(t["content"] or "") for t in turns[cut:])

    first = render(0)
    assert fit_by_dropping_turns(turns, first, render, 60) is first  # it fits: nothing dropped
    assert len(fit_by_dropping_turns(turns, first, render, 35)[2]) == 30  # the first exchange (4 turns) goes
    assert len(fit_by_dropping_turns(turns, first, render, 15)[2]) == 10  # all but the last
    assert len(fit_by_dropping_turns(turns, first, render, 5)[2]) == 10  # the last stays, too long or not
    assert set(cuts) <= {0, 4, 6}  # only at user messages


def test_nothing_left_running(server):
    server.wait_idle()
    assert not server.engine.llm.has_unfinished_requests()


def test_input_tokens_counts_what_a_create_would_give_the_model(client):
    asks = [
        {"input": ASK},
        {"input": ASK, "instructions": "Answer in French.", "tools": [WEATHER]},
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}],
            "reasoning": {"effort": "low"},
        },
    ]
    for ask in asks:
        counted = client.responses.input_tokens.count(model="m", **ask)
        assert counted.object == "response.input_tokens"
        made = client.responses.create(model="m", max_output_tokens=1, **ask)
        assert counted.input_tokens == made.usage.input_tokens
    # a follow-up: the previous response's conversation counts too
    follow = {"input": "And of Spain?", "previous_response_id": made.id}
    counted = client.responses.input_tokens.count(model="m", **follow)
    assert (
        counted.input_tokens
        == client.responses.create(model="m", max_output_tokens=1, **follow).usage.input_tokens
    )
    assert counted.input_tokens > made.usage.input_tokens
    with pytest.raises(openai.NotFoundError, match="no stored response 'resp_nope'"):
        client.responses.input_tokens.count(model="m", input=ASK, previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\].role is 'robot'"):
        client.responses.input_tokens.count(model="m", input=[{"role": "robot", "content": "hi"}])
