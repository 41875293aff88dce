"""The Responses API's compaction (engine/api/response_compaction.py). POST /v1/responses/compact: the
conversation to go on with, its latest user messages as they were and one compaction item the served model
summarised the rest into; a later request reads that item as the summary; another server's item is named as
unreadable, not refused. A compaction_trigger input item: the response is one compaction item that carries
the conversation alone. context_management's compact_threshold: past it, the reply comes from the compacted
context, after its compaction item."""

from __future__ import annotations

import base64
import json
import time

import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api import response_compaction
from engine.async_llm import AsyncLLM

HISTORY = [
    {"role": "user", "content": "Fix the failing test in parser.py."},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": "pytest -x"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "1 failed: test_empty_input"},
    {"role": "assistant", "content": "The empty input case raises IndexError."},
    {"role": "user", "content": [{"type": "input_text", "text": "Go on, and keep the old behaviour."}]},
]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def test_the_model_summarises_the_rest_and_the_user_messages_are_kept():
    engine = ScriptedEngine(
        ["The user wants parser.py's empty input fixed; pytest showed IndexError.", "OK."]
    )
    with RunningServer(engine) as s:
        client = _client(s)
        compacted = client.responses.compact(model="m", input=HISTORY)
        assert compacted.object == "response.compaction" and compacted.usage.output_tokens > 0
        kinds = [(i.type, getattr(i, "role", None)) for i in compacted.output]
        assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
        assert compacted.output[1].content[0].text == "Go on, and keep the old behaviour."
        assert "Write a summary that lets you go on" in engine.prompts[0]  # asked of the model
        assert "pytest -x" in engine.prompts[0] and "1 failed" in engine.prompts[0]
        item = compacted.output[-1]
        assert item.encrypted_content.startswith("ninfer-summary-v1:")
        # the next turn goes on from the compacted conversation
        follow = [i.model_dump(exclude_none=True) for i in compacted.output]
        follow.append({"role": "user", "content": "What did you find?"})
        client.responses.create(model="m", input=follow)
        assert (
            "Summary of the conversation before this point (it was compacted):\n"
            "The user wants parser.py's empty input fixed; pytest showed IndexError."
        ) in engine.prompts[1]
        assert "pytest -x" not in engine.prompts[1]


def test_an_item_another_server_compacted_is_named_not_refused():
    engine = ScriptedEngine(["OK."])
    with RunningServer(engine) as s:
        foreign = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABo-opaque"}
        _client(s).responses.create(model="m", input=[foreign, {"role": "user", "content": "Next?"}])
        assert "compacted by another server; its summary cannot be read here" in engine.prompts[0]


def test_only_the_latest_user_messages_within_the_budget_are_kept(monkeypatch):
    monkeypatch.setattr(response_compaction, "KEPT_USER_TOKENS", 12)
    engine = ScriptedEngine(["summary"])
    many = [{"role": "user", "content": f"message number {i} with some words"} for i in range(5)]
    with RunningServer(engine) as s:
        output = _client(s).responses.compact(model="m", input=many).output
    texts = [i.content[0].text for i in output if i.type == "message"]
    assert texts and texts == [m["content"] for m in many[-len(texts) :]] and len(texts) < 5


def test_a_real_model_compacts_and_goes_on():
    with RunningServer(AsyncLLM()) as s:
        client = _client(s)
        compacted = client.responses.compact(model="m", input=HISTORY, extra_body={"max_output_tokens": 24})
        summary = compacted.output[-1].encrypted_content.removeprefix("ninfer-summary-v1:")
        assert base64.b64decode(summary).decode().strip()
        assert compacted.usage.output_tokens <= 24
        follow = [i.model_dump(exclude_none=True) for i in compacted.output] + [
            {"role": "user", "content": "Next?"}
        ]
        assert client.responses.create(model="m", input=follow, max_output_tokens=4).status in (
            "completed",
            "incomplete",
        )
        s.wait_idle()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m"}, "'input' (or previous_response_id) is required"),
        ({"model": "m", "input": 5}, "'input' must be a string or an array of items"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role is 'robot'"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_nope"}, "no stored response 'resp_nope'"),
    ],
)
def test_what_cannot_be_compacted_is_refused_in_a_sentence(body, message):
    import httpx2 as httpx

    with RunningServer(ScriptedEngine(["x"])) as s:
        r = httpx.post(f"{s.url}/v1/responses/compact", json=body)
        assert r.status_code in (400, 404) and message in r.json()["error"]["message"]


def _decoded(item) -> dict:
    tag = "ninfer-compaction-v1:"
    assert item.type == "compaction" and item.encrypted_content.startswith(tag)
    return json.loads(base64.b64decode(item.encrypted_content[len(tag) :]))


@pytest.mark.parametrize("streamed", [False, True])
def test_a_compaction_trigger_gets_one_compaction_item_and_the_next_turn_goes_on_from_it(streamed):
    engine = ScriptedEngine(
        ["Fixing parser.py's empty input; IndexError found.", "Found the fix.", "Still on it."]
    )
    with RunningServer(engine) as s:
        client = _client(s)
        asked = {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "store": True}
        if streamed:
            events = list(client.responses.create(**asked, stream=True))
            kinds = [e.type for e in events]
            assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
            assert kinds[-2:] == ["response.output_item.done", "response.completed"]
            assert set(kinds[3:-2]) == {"response.compaction.compacting"}
            assert events[2].item.type == "compaction" and events[2].item.id == events[-2].item.id
            response = events[-1].response
        else:
            response = client.responses.create(**asked)
        assert len(engine.prompts) == 1  # the summary, and no reply besides
        assert "Write a summary that lets you go on" in engine.prompts[0] and "pytest -x" in engine.prompts[0]
        assert [i.type for i in response.output] == ["compaction"] and response.status == "completed"
        assert response.usage.output_tokens > 0
        whole = _decoded(response.output[0])
        assert whole["summary"] == "Fixing parser.py's empty input; IndexError found."
        assert whole["user"] == ["Fix the failing test in parser.py.", "Go on, and keep the old behaviour."]
        # a stateless client sends it all back: what the item stands for is not read again
        item = response.output[0].model_dump(exclude_none=True)
        client.responses.create(model="m", input=[*HISTORY, item, {"role": "user", "content": "Found it?"}])
        assert (
            "IndexError found." in engine.prompts[1]
            and "Go on, and keep the old behaviour." in engine.prompts[1]
        )
        assert "pytest -x" not in engine.prompts[1] and "Found it?" in engine.prompts[1]
        # chained by id, the stored conversation is the compacted one
        client.responses.create(model="m", previous_response_id=response.id, input="And now?")
        assert "IndexError found." in engine.prompts[2] and "pytest -x" not in engine.prompts[2]


@pytest.mark.parametrize("streamed", [False, True])
def test_past_the_compact_threshold_the_reply_is_written_from_the_compacted_context(streamed):
    engine = ScriptedEngine(["Fixing parser.py; IndexError on empty input.", "Done: guarded the empty case."])
    with RunningServer(engine) as s:
        client = _client(s)
        asked = {
            "model": "m",
            "input": HISTORY,
            "context_management": [{"type": "compaction", "compact_threshold": 20}],
        }
        if streamed:
            events = list(client.responses.create(**asked, stream=True))
            done = [e for e in events if e.type == "response.output_item.done"]
            assert [(e.output_index, e.item.type) for e in done] == [(0, "compaction"), (1, "message")]
            deltas = [e for e in events if e.type == "response.output_text.delta"]
            assert deltas and all(e.output_index == 1 for e in deltas)
            response = events[-1].response
        else:
            response = client.responses.create(**asked)
        assert [i.type for i in response.output] == ["compaction", "message"]
        assert response.output[1].content[0].text == "Done: guarded the empty case."
        assert "pytest -x" in engine.prompts[0] and "pytest -x" not in engine.prompts[1]
        assert (
            "IndexError on empty input." in engine.prompts[1]
            and "keep the old behaviour" in engine.prompts[1]
        )
        # both passes are counted
        prompt_tokens = [len(s.engine.tokenizer.encode(p, False)) for p in engine.prompts]
        assert response.usage.input_tokens >= sum(prompt_tokens) - 2
        assert response.usage.output_tokens >= 2


def test_under_the_compact_threshold_nothing_is_compacted():
    engine = ScriptedEngine(["Done."])
    with RunningServer(engine) as s:
        response = _client(s).responses.create(
            model="m",
            input=HISTORY,
            context_management=[{"type": "compaction", "compact_threshold": 100_000}],
        )
    assert [i.type for i in response.output] == ["message"] and len(engine.prompts) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"input": [{"type": "compaction_trigger"}, HISTORY[0]]},
            "input[0] is a compaction_trigger, which goes last",
        ),
        (
            {"input": "x", "context_management": {"type": "compaction"}},
            "'context_management' must be an array",
        ),
        ({"input": "x", "context_management": [{"type": "clear"}]}, "context_management[0] has type 'clear'"),
        (
            {"input": "x", "context_management": [{"type": "compaction", "compact_threshold": 0}]},
            "context_management[0].compact_threshold must be a positive whole number",
        ),
    ],
)
def test_what_cannot_compact_is_refused_in_a_sentence(body, message):
    import httpx2 as httpx

    engine = ScriptedEngine(["x"])
    with RunningServer(engine) as s:
        r = httpx.post(f"{s.url}/v1/responses", json={"model": "m", **body})
    assert r.status_code == 400 and message in r.json()["error"]["message"] and not engine.prompts


def test_a_real_model_compacts_in_band():
    with RunningServer(AsyncLLM(max_context=512)) as s:  # (a threshold's summary: 256 tokens at most)
        client = _client(s)
        asked = {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "max_output_tokens": 16}
        # greedy and past EOS: a summary of some words whatever the model's first token
        events = list(
            client.responses.create(**asked, stream=True, temperature=0, extra_body={"ignore_eos": True})
        )
        response = events[-1].response
        assert [i.type for i in response.output] == ["compaction"] and _decoded(response.output[0])["summary"]
        follow = client.responses.create(
            model="m",
            previous_response_id=response.id,
            input="Next?",
            max_output_tokens=4,
            context_management=[{"type": "compaction", "compact_threshold": 10}],
        )
        assert [i.type for i in follow.output][:1] == ["compaction"] and follow.status in (
            "completed",
            "incomplete",
        )
        s.wait_idle()


@pytest.mark.parametrize("streamed", [False, True])
def test_a_background_response_compacts_past_its_threshold(streamed):
    engine = ScriptedEngine(["Fixing parser.py; IndexError.", "Done."])
    with RunningServer(engine) as s:
        client = _client(s)
        threshold = [{"type": "compaction", "compact_threshold": 20}]
        asked = {"model": "m", "input": HISTORY, "background": True, "context_management": threshold}
        if streamed:
            rid = list(client.responses.create(**asked, stream=True))[-1].response.id
        else:
            rid = client.responses.create(**asked).id
        deadline = time.monotonic() + 60
        while (response := client.responses.retrieve(rid)).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert response.status == "completed" and [i.type for i in response.output] == ["compaction", "message"]
    assert _decoded(response.output[0])["summary"] == "Fixing parser.py; IndexError."


def test_compacting_again_keeps_the_user_messages_the_last_compaction_carried():
    engine = ScriptedEngine(["First summary.", "Second summary."])
    with RunningServer(engine) as s:
        client = _client(s)
        trigger = {"type": "compaction_trigger"}
        first = client.responses.create(model="m", input=[*HISTORY, trigger]).output[0]
        again = [first.model_dump(exclude_none=True), {"role": "user", "content": "Now the docs."}, trigger]
        second = _decoded(client.responses.create(model="m", input=again).output[0])
    assert second["summary"] == "Second summary." and "First summary." in engine.prompts[1]
    assert second["user"] == [
        "Fix the failing test in parser.py.",
        "Go on, and keep the old behaviour.",
        "Now the docs.",
    ]


def test_without_a_threshold_a_prompt_that_would_not_fit_is_compacted_instead_of_refused():
    engine = ScriptedEngine(["Summary of a long paste.", "Done.", "Hello."])
    engine.llm.max_context = 400  # (an instance's own: the class's stays for the other tests)
    long = []
    for turn in range(8):  # ~1,300 tokens: the summary is written from the latest turns that fit
        long.append(
            {"role": "user", "content": f"Part {turn}: " + " ".join(f"w{turn}x{i}" for i in range(40))}
        )
        long.append({"role": "assistant", "content": f"Noted part {turn}."})
    long.append({"role": "user", "content": "Now sum it up."})
    with RunningServer(engine) as s:
        client = _client(s)
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            client.responses.create(model="m", input=long, max_output_tokens=50)
        response = client.responses.create(
            model="m", input=long, max_output_tokens=50, context_management=[{"type": "compaction"}]
        )
        short = client.responses.create(
            model="m", input="Hi", max_output_tokens=50, context_management=[{"type": "compaction"}]
        )
    assert [i.type for i in response.output] == ["compaction", "message"]
    assert [i.type for i in short.output] == ["message"]
