"""A chat template that takes one system message, first (Qwen3.5's and Qwen3.6's raise "System message must
be at the beginning."), still renders a conversation with more: the leading ones folded into one, a later
one (a client's hook context, a `developer` message mid-conversation) a user message in place. Templates
that take them as they are render them as they are."""

from __future__ import annotations

import pytest
from server import templated_prompt

from engine.chat_template import with_system_first

SYSTEM_FIRST = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and not loop.first -%}"
    "{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
ANY_ORDER = SYSTEM_FIRST.replace("not loop.first", "false")
REFUSES_ALL = "{{ raise_exception('This template takes no conversation.') }}"

LEADING = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "developer", "content": "Ask before deleting files."},
    {"role": "user", "content": "Clean up the build folder."},
]
LATER = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug."},
    {"role": "assistant", "content": "Fixed."},
    {"role": "system", "content": "Hook: the tests passed."},
    {"role": "user", "content": "Commit it."},
]


def test_leading_system_messages_are_folded_into_one():
    code, prompt = templated_prompt(SYSTEM_FIRST, LEADING)
    assert code == 200, prompt
    assert prompt.startswith(
        "<|im_start|>system\nYou are a coding agent.\n\nAsk before deleting files.<|im_end|>"
    )


def test_a_later_system_message_becomes_a_user_message_in_place():
    code, prompt = templated_prompt(SYSTEM_FIRST, LATER)
    assert code == 200, prompt
    assert (
        "<|im_start|>assistant\nFixed.<|im_end|>\n<|im_start|>user\nHook: the tests passed.<|im_end|>"
        in prompt
    )
    assert prompt.startswith("<|im_start|>system\nYou are a coding agent.<|im_end|>")  # (the head unchanged)


def test_a_template_that_takes_them_gets_them_as_they_are():
    code, prompt = templated_prompt(ANY_ORDER, LATER)
    assert code == 200 and "<|im_start|>system\nHook: the tests passed." in prompt


def test_another_refusal_is_said_as_the_template_said_it():
    code, text = templated_prompt(REFUSES_ALL, LATER)
    assert code == 400 and "This template takes no conversation." in text


@pytest.mark.parametrize("messages", [[], [{"role": "user", "content": "hi"}], LEADING[:1] + LEADING[2:]])
def test_nothing_to_place_is_no_change(messages):
    assert with_system_first(messages) is None


def test_parts_are_folded_in_order():
    systems = [
        {"role": "system", "content": [{"type": "text", "text": "A"}]},
        {"role": "system", "content": "B"},
        {"role": "user", "content": "go"},
    ]
    head = with_system_first(systems)[0]["content"]
    assert [p["text"] for p in head] == ["A", "\n\n", "B"]
