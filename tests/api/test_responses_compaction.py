"""POST /v1/responses/compact (engine/api/response_compaction.py): the conversation to go on with, its
latest user messages as they were and one compaction item the served model summarised the rest into; a
later request reads that item as the summary; another server's item is named as unreadable, not refused."""

from __future__ import annotations

import base64

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


def test_in_band_compaction_is_refused_with_what_to_do_instead():
    with (
        RunningServer(ScriptedEngine(["x"])) as s,
        pytest.raises(
            openai.BadRequestError, match=r"input\[1\] is a compaction_trigger .* POST /v1/responses/compact"
        ),
    ):
        _client(s).responses.create(model="m", input=[HISTORY[0], {"type": "compaction_trigger"}])
