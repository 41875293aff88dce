"""A chat template that takes one system message, first (Qwen3.5's and Qwen3.6's raise "System message must
be at the beginning."), still renders a conversation with more: the leading ones folded into one, a later
one (a client's hook context, a `developer` message mid-conversation) a user message in place. Templates
that take them as they are render them as they are."""

from __future__ import annotations

from dataclasses import replace

import anthropic
import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer, templated_prompt

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


# Claude Code (2.1.154 on) sends its harness context (the agents and skills it offers) as a system message
# inside `messages`, after the user turn, on nearly every request: Anthropic's mid-conversation system
# messages, a string or text blocks
HARNESS = [
    {"role": "user", "content": "Fix the bug."},
    {"role": "system", "content": [{"type": "text", "text": "Agents: explore, plan."}]},
]


@pytest.mark.parametrize("template", [SYSTEM_FIRST, ANY_ORDER])
def test_anthropic_mid_conversation_system_messages_are_taken(template):
    engine = ScriptedEngine(["Done."] * 3)
    engine.tokenizer = replace(engine.tokenizer, chat_template=template)
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        reply = claude.messages.create(
            model="m", max_tokens=20, system="You are a coding agent.", messages=HARNESS
        )
        counted = claude.messages.count_tokens(model="m", system="You are a coding agent.", messages=HARNESS)
        bad = {"model": "m", "max_tokens": 20, "messages": [HARNESS[0], {"role": "system", "content": 7}]}
        refused = httpx.post(f"{server.url}/v1/messages", json=bad, timeout=30)
    assert reply.content[0].text == "Done." and counted.input_tokens > 0
    role = "user" if template == SYSTEM_FIRST else "system"  # (in place, where the template takes one system)
    assert f"<|im_start|>{role}\nAgents: explore, plan.<|im_end|>" in engine.prompts[0]
    assert engine.prompts[0].startswith("<|im_start|>system\nYou are a coding agent.<|im_end|>")
    assert refused.status_code == 400
    assert (
        refused.json()["error"]["message"]
        == "'messages[1].content' must be a string or an array of text blocks"
    )
