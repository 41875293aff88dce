"""A chat template that can keep every earlier turn's reasoning (Qwen3.6's `preserve_thinking`) keeps it
when the conversation sends reasoning back, unless the request or --chat-template-kwargs says otherwise:
without it a new user message drops the earlier turns' reasoning, and the prompt stops matching the prefix
cache at the first assistant turn (engine/chat_template.py, `with_kept_reasoning`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import PRESERVING_TEMPLATE

from engine.chat_template import with_kept_reasoning
from engine.tokenizer import with_template_kwargs

REASONED = [
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "Reading the file.", "reasoning_content": "The bug is in the parser."},
    {"role": "user", "content": "Now add a test."},
]


@pytest.fixture
def tokenizer(default_tokenizer):
    return replace(default_tokenizer, chat_template=PRESERVING_TEMPLATE)


def test_reasoning_sent_back_is_kept_after_a_new_user_message(tokenizer):
    assert "The bug is in the parser." in tokenizer.apply_chat_template(REASONED)


def test_the_request_or_the_server_may_drop_it(tokenizer):
    assert "parser" not in tokenizer.apply_chat_template(REASONED, preserve_thinking=False)
    server = with_template_kwargs(tokenizer, (("preserve_thinking", False),))
    assert "parser" not in server.apply_chat_template(REASONED)


def test_a_conversation_without_reasoning_renders_as_before(tokenizer):
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in REASONED]
    assert "<think>\n\n</think>" not in tokenizer.apply_chat_template(plain)  # (no empty blocks added)
    assert with_kept_reasoning(PRESERVING_TEMPLATE, plain, {}) == {}


def test_templates_that_do_not_read_it_get_nothing():
    assert with_kept_reasoning("{{ messages }}", REASONED, {"enable_thinking": True}) == {
        "enable_thinking": True
    }


def test_a_turn_that_grows_the_conversation_extends_the_last_prompt(tokenizer):
    """The point of it: the prompt of a new user message starts with the last prompt of the tool loop and the
    reply the model wrote (so the prefix cache serves all of it)."""
    loop = [
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "<tool_call>read</tool_call>",
            "reasoning_content": "Read it first.",
        },
        {"role": "tool", "content": "def parse(): ..."},
    ]
    before = tokenizer.apply_chat_template(loop)
    reply = "The parser drops the last token.\n</think>\n\nFixed it."
    turn = [
        *loop,
        {
            "role": "assistant",
            "content": "Fixed it.",
            "reasoning_content": "The parser drops the last token.",
        },
        {"role": "user", "content": "Now add a test."},
    ]
    assert tokenizer.apply_chat_template(turn).startswith(before + reply)
    dropped = tokenizer.apply_chat_template(turn, preserve_thinking=False)
    assert not dropped.startswith(before)  # (the first assistant turn lost its reasoning)


def test_reasoning_kept_in_a_replys_content_counts_too(tokenizer):
    """`ninfer chat` keeps a reply as written, `<think>` part and all; the Qwen templates split it there."""
    turns = [
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "<think>\nThe parser.\n</think>\n\nFixed."},
        {"role": "user", "content": "Thanks."},
    ]
    assert with_kept_reasoning(PRESERVING_TEMPLATE, turns, {}) == {"preserve_thinking": True}
