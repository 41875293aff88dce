"""Which output tokens are the Responses message's (engine/api/response_logprobs.py): those of its text,
not those of the reasoning before it or of the tool calls after it, whatever the tokens' grouping."""

from __future__ import annotations

import math

import pytest
from scripted_engine import _tokenizer

from engine.api.errors import ApiError
from engine.api.response_items import output_items
from engine.api.response_logprobs import MessageLogprobs, logprobs_setting
from engine.api.token_names import TokenNames
from engine.parsers.tool_calls import ToolCall
from engine.request import RequestOutput, SamplingParams

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
EOS = 2


def _output(token_ids: list[int], upto: int, finished: bool) -> RequestOutput:
    """The reply's first `upto` tokens, each given logprob -0.5 and one alternative (token 0)."""
    ids = token_ids[:upto]
    return RequestOutput(
        request_id="r",
        prompt=None,
        prompt_token_ids=[1],
        token_ids=ids,
        text="",
        logprobs=[{t: -0.5, 0: -1.5} for t in ids],
        finish_reason="stop" if finished else None,
    )


def _message_text(reply: str, in_reasoning: bool, step: int, top: int = 1) -> list[dict]:
    tokenizer = _tokenizer()
    ids = tokenizer.encode(reply) + [EOS]
    tracker = MessageLogprobs(
        TokenNames(tokenizer), SamplingParams(logprobs=top), (EOS,), in_reasoning, TOOLS, None
    )
    entries = []
    for upto in range(step, len(ids) + step, step):  # the engine's steps: `step` tokens each
        entries += tracker.feed(_output(ids, min(upto, len(ids)), upto >= len(ids)))
    return entries


@pytest.mark.parametrize("step", [1, 3, 7])
@pytest.mark.parametrize(
    "reply, in_reasoning, message",
    [
        ("The capital of France is Paris.", False, "The capital of France is Paris."),
        ("weighing it</think>Paris, of course.", True, "Paris, of course."),
        ("<think>hmm</think>\n\nIt is Paris.", False, "It is Paris."),  # the newlines are neither's
        (
            'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            False,
            "Let me look.\n",
        ),
        # a token across the text's end and a tag (SmolLM2 has ".<") is the message's
        ('Look.<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', False, "Look.<"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', False, ""),
        ('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\nDone.', False, "\nDone."),
        ("all of it thought, never closed", True, ""),
        # a call the reply ended inside is a call (as streamed and not), not text
        ('Look.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci', False, "Look.\n"),
    ],
)
def test_only_the_message_texts_tokens(reply, in_reasoning, message, step):
    entries = _message_text(reply, in_reasoning, step)
    assert "".join(e["token"] for e in entries) == message
    assert all(e["logprob"] == -0.5 and len(e["top_logprobs"]) == 1 for e in entries)
    assert all(e["bytes"] == list(e["token"].encode()) for e in entries)


@pytest.mark.parametrize("step", [1, 4])
def test_each_text_part_has_its_own_entries(step):
    """Text, a call, text: two message items, each with its own tokens (a non-streamed reply's items)."""
    tokenizer = _tokenizer()
    call = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    ids = tokenizer.encode(f"First.\n{call}\nThen this.") + [EOS]
    tracker = MessageLogprobs(TokenNames(tokenizer), SamplingParams(logprobs=0), (EOS,), False, TOOLS, None)
    for upto in range(step, len(ids) + step, step):
        tracker.feed(_output(ids, min(upto, len(ids)), upto >= len(ids)))
    assert ["".join(e["token"] for e in group) for group in tracker.groups] == ["First.\n", "\nThen this."]


def test_top_logprobs_are_ranked_and_capped():
    entries = _message_text("Paris.", False, 1, top=5)
    for e in entries:  # two known alternatives: the token itself, then token 0
        assert [a["logprob"] for a in e["top_logprobs"]] == [-0.5, -1.5]
        assert e["top_logprobs"][0]["token"] == e["token"]
    assert not any(math.isinf(e["logprob"]) for e in entries)


@pytest.mark.parametrize(
    "body, top",
    [
        ({}, None),
        ({"top_logprobs": 5}, None),  # OpenAI answers [] unless `include` asks
        ({"include": ["message.output_text.logprobs"]}, 0),
        ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"], "top_logprobs": 3}, 3),
        ({"include": ["reasoning.encrypted_content"], "top_logprobs": 3}, None),
    ],
)
def test_include_and_top_logprobs(body, top):
    assert logprobs_setting(body) == top


@pytest.mark.parametrize(
    "body, words",
    [
        ({"top_logprobs": 21}, "'top_logprobs' must be between 0 and 20 (got 21)"),
        ({"top_logprobs": -1}, "'top_logprobs' must be between 0 and 20"),
        ({"include": "message.output_text.logprobs"}, "'include' must be"),
        ({"include": [1]}, "'include' must be an array of strings"),
    ],
)
def test_bad_settings_are_said(body, words):
    with pytest.raises(ApiError) as e:
        logprobs_setting(body)
    assert words in e.value.message


def test_a_whole_replys_items_take_their_own_groups():
    """output_items (the reply without streaming): each message item its text part's entries, in order."""
    call = ToolCall("get_weather", {})
    first, second = [{"token": "A"}], [{"token": "B"}]
    items = output_items("", ["A", call, "B"], logprobs=[first, second])
    assert [i["type"] for i in items] == ["message", "function_call", "message"]
    assert [items[0]["content"][0]["logprobs"], items[2]["content"][0]["logprobs"]] == [first, second]
    assert output_items("", ["A"])[0]["content"][0]["logprobs"] == []
