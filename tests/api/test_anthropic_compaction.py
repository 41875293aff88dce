"""Anthropic's compaction on /v1/messages (engine/api/anthropic_compaction.py): the `compaction` parameter
makes the reply one compaction block; the compact_20260112 edit compacts past its trigger and writes the
reply from the compacted context (or pauses after the block); a compaction block sent back stands for the
messages before it, which are not rendered; malformed requests are 400s in a sentence."""

from __future__ import annotations

import json

import anthropic
import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api.anthropic_compaction import carried
from engine.async_llm import AsyncLLM

MESSAGES = [
    {"role": "user", "content": "Fix the failing test in parser.py."},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "shell", "input": {"cmd": "pytest -x"}}],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1 failed: test_empty_input"}],
    },
    {"role": "assistant", "content": "The empty input case raises IndexError."},
    {"role": "user", "content": [{"type": "text", "text": "Go on, and keep the old behaviour."}]},
]
TOOLS = [
    {"name": "shell", "description": "run a command", "input_schema": {"type": "object", "properties": {}}}
]
SUMMARY = "Fixing parser.py's empty input; pytest showed IndexError."


def _client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)


def _edit(value: int, **more) -> dict:
    return {
        "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": value}, **more}]
    }


def test_the_compaction_parameter_answers_with_one_block_sent_back_in_place_of_the_conversation():
    engine = ScriptedEngine([SUMMARY, "Next, the fix."])
    with RunningServer(engine) as s:
        client = _client(s)
        reply = client.beta.messages.create(
            model="m",
            max_tokens=64,
            tools=TOOLS,
            messages=MESSAGES,
            extra_body={"compaction": {"type": "summarize"}},
        )
        assert reply.stop_reason == "compaction" and [b.type for b in reply.content] == ["compaction"]
        assert reply.content[0].content == SUMMARY
        assert carried(reply.content[0].model_dump()) == [
            "Fix the failing test in parser.py.",
            "Go on, and keep the old behaviour.",
        ]
        assert reply.usage.output_tokens > 0 and [i.type for i in reply.usage.iterations] == ["compaction"]
        assert "Write a summary that lets you go on" in engine.prompts[0] and "pytest -x" in engine.prompts[0]
        # the block goes first in later messages, in place of what it summarises; a sender that keeps the
        # whole history has it left out all the same
        block = reply.content[0].model_dump(exclude_none=True)
        follow = [
            *MESSAGES,
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": "Found it?"},
        ]
        client.beta.messages.create(model="m", max_tokens=16, tools=TOOLS, messages=follow)
        assert SUMMARY in engine.prompts[1] and "keep the old behaviour" in engine.prompts[1]
        assert "pytest -x" not in engine.prompts[1] and "Found it?" in engine.prompts[1]


@pytest.mark.parametrize("streamed", [False, True])
def test_past_the_trigger_the_reply_is_written_from_the_compacted_context(streamed):
    engine = ScriptedEngine([SUMMARY, "Done: guarded the empty case."] * 2)
    with RunningServer(engine) as s:
        asked = {
            "model": "m",
            "max_tokens": 64,
            "tools": TOOLS,
            "messages": MESSAGES,
            "context_management": _edit(20),
        }
        if streamed:
            r = httpx.post(f"{s.url}/v1/messages", json={**asked, "stream": True}, timeout=30)
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
            starts = [
                (e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"
            ]
            assert starts == [(0, "compaction"), (1, "text")]
            (compaction_delta,) = [e for e in events if e.get("delta", {}).get("type") == "compaction_delta"]
            assert compaction_delta["index"] == 0 and compaction_delta["delta"]["content"] == SUMMARY
            (final,) = [e for e in events if e["type"] == "message_delta"]
            assert final["delta"]["stop_reason"] == "end_turn"
            usage = final["usage"]
            # the SDK assembles it as Anthropic's stream
            with _client(s).beta.messages.stream(
                **{k: v for k, v in asked.items() if k != "context_management"},
                extra_body={"context_management": _edit(20)},
            ) as stream:
                assembled = stream.get_final_message()
            assert [b.type for b in assembled.content] == ["compaction", "text"]
        else:
            r = httpx.post(f"{s.url}/v1/messages", json=asked, timeout=30)
            reply = r.json()
            assert [b["type"] for b in reply["content"]] == ["compaction", "text"]
            assert (
                reply["content"][1]["text"] == "Done: guarded the empty case."
                and reply["stop_reason"] == "end_turn"
            )
            usage = reply["usage"]
    assert "pytest -x" in engine.prompts[0] and "pytest -x" not in engine.prompts[1]
    assert SUMMARY in engine.prompts[1] and "keep the old behaviour" in engine.prompts[1]
    kinds = [i["type"] for i in usage["iterations"]]
    assert kinds == ["compaction", "message"]
    # the top-level counts are the reply's alone, as Anthropic's API counts them
    assert usage["output_tokens"] == usage["iterations"][1]["output_tokens"]
    assert usage["input_tokens"] == usage["iterations"][1]["input_tokens"]


def test_paused_after_compaction_the_block_comes_alone_and_sent_back_the_turn_goes_on():
    engine = ScriptedEngine([SUMMARY, "Done."])
    with RunningServer(engine) as s:
        client = _client(s)
        edit = _edit(20, pause_after_compaction=True)
        paused = client.beta.messages.create(
            model="m", max_tokens=64, messages=MESSAGES, extra_body={"context_management": edit}
        )
        assert paused.stop_reason == "compaction" and [b.type for b in paused.content] == ["compaction"]
        assert paused.usage.output_tokens == 0 and paused.usage.iterations[0].output_tokens > 0
        back = [
            *MESSAGES,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in paused.content]},
        ]
        went_on = client.beta.messages.create(
            model="m", max_tokens=64, messages=back, extra_body={"context_management": edit}
        )
    assert went_on.content[0].text == "Done." and len(engine.prompts) == 2
    # not a prefill to continue: the reply is the assistant's own turn after the summary
    assert engine.prompts[1].startswith("<|im_start|>user\nSummary of the conversation")
    assert engine.prompts[1].endswith("keep the old behaviour.<|im_end|>\n<|im_start|>assistant\n")
    assert SUMMARY in engine.prompts[1] and "pytest -x" not in engine.prompts[1]


def test_the_parameter_compacts_a_conversation_that_ends_in_a_block_too():
    engine = ScriptedEngine(["Second summary."])
    first = {"type": "compaction", "content": SUMMARY}
    with RunningServer(engine) as s:
        reply = _client(s).beta.messages.create(
            model="m",
            max_tokens=64,
            messages=[*MESSAGES, {"role": "assistant", "content": [first]}],
            extra_body={"compaction": {"type": "summarize", "instructions": "Summarise in one line."}},
        )
    assert reply.stop_reason == "compaction" and reply.content[0].content == "Second summary."
    assert engine.prompts[0].count("Summarise in one line.") == 1 and SUMMARY in engine.prompts[0]
    assert "Write a summary that lets you go on" not in engine.prompts[0]


def test_under_the_trigger_nothing_is_compacted_and_a_failed_block_is_passed_over():
    engine = ScriptedEngine(["Done.", "Again."])
    with RunningServer(engine) as s:
        client = _client(s)
        reply = client.beta.messages.create(
            model="m", max_tokens=16, messages=MESSAGES, extra_body={"context_management": _edit(100_000)}
        )
        assert [b.type for b in reply.content] == ["text"] and len(engine.prompts) == 1
        failed = [*MESSAGES[:3], {"role": "assistant", "content": [{"type": "compaction", "content": None}]}]
        client.beta.messages.create(
            model="m", max_tokens=16, messages=[*failed, {"role": "user", "content": "Go"}]
        )
    assert "pytest -x" in engine.prompts[1]  # a failed compaction stands for nothing


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"compaction": {"type": "squash"}}, '\'compaction\' must be {"type": "summarize"}'),
        (
            {"compaction": {"type": "summarize"}, "context_management": _edit(10)},
            "'compaction' cannot be combined with 'context_management'",
        ),
        (
            {
                "context_management": {
                    "edits": [{"type": "compact_20260112", "trigger": {"type": "turns", "value": 3}}]
                }
            },
            'edits[0].trigger must be {"type": "input_tokens", "value": N}',
        ),
        (
            {"context_management": _edit(10, pause_after_compaction="yes")},
            "pause_after_compaction must be true or false",
        ),
        ({"context_management": {"edits": [{"type": "compact_20260112"}] * 2}}, "may be listed once"),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "compaction", "content": ""}]}]},
            "messages[0].content[0].content must be the summary",
        ),
    ],
)
def test_what_cannot_compact_is_refused_in_a_sentence(extra, message):
    engine = ScriptedEngine(["x"])
    with RunningServer(engine) as s:
        r = httpx.post(
            f"{s.url}/v1/messages", json={"model": "m", "max_tokens": 8, "messages": MESSAGES, **extra}
        )
    assert r.status_code == 400 and message in r.json()["error"]["message"] and not engine.prompts


def test_a_real_model_compacts_and_goes_on():
    with RunningServer(AsyncLLM(max_context=512)) as s:  # (a summary of 256 tokens at most)
        client = _client(s)
        reply = client.beta.messages.create(
            model="m", max_tokens=8, messages=MESSAGES, extra_body={"context_management": _edit(10)}
        )
        assert reply.content[0].type == "compaction" and reply.usage.iterations[0].type == "compaction"
        assert reply.stop_reason in ("end_turn", "max_tokens")
        alone = client.beta.messages.create(
            model="m", max_tokens=6, messages=MESSAGES, extra_body={"compaction": {"type": "summarize"}}
        )
        assert alone.stop_reason == "compaction" and alone.usage.output_tokens <= 6
        s.wait_idle()


def test_a_prompt_that_would_not_fit_is_compacted_before_its_trigger():
    engine = ScriptedEngine(["Summary of a long paste.", "Done."])
    engine.llm.max_context = 400
    messages = []
    for turn in range(8):
        messages.append(
            {"role": "user", "content": f"Part {turn}: " + " ".join(f"w{turn}x{i}" for i in range(40))}
        )
        messages.append({"role": "assistant", "content": f"Noted part {turn}."})
    messages.append({"role": "user", "content": "Now sum it up."})
    with RunningServer(engine) as s:
        client = _client(s)
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            client.messages.create(model="m", max_tokens=50, messages=messages)
        reply = client.beta.messages.create(
            model="m", max_tokens=50, messages=messages, extra_body={"context_management": _edit(150_000)}
        )
    assert [b.type for b in reply.content] == ["compaction", "text"] and reply.content[1].text == "Done."
    assert "Now sum it up." in engine.prompts[1] and "w0x1 " not in engine.prompts[1]


def test_a_streamed_pause_ends_after_the_block():
    engine = ScriptedEngine([SUMMARY])
    with RunningServer(engine) as s:
        asked = {
            "model": "m",
            "max_tokens": 64,
            "messages": MESSAGES,
            "stream": True,
            "context_management": _edit(20, pause_after_compaction=True),
        }
        r = httpx.post(f"{s.url}/v1/messages", json=asked, timeout=30)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    final = events[-2]
    assert final["delta"]["stop_reason"] == "compaction" and final["usage"]["output_tokens"] == 0
    assert final["usage"]["iterations"][0]["type"] == "compaction" and len(engine.prompts) == 1
