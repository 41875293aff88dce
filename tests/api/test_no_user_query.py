"""A conversation with no user message renders though the Qwen templates refuse it ("No user query found in
messages."): a system prompt alone, an agent history whose user turn was compacted away, a group chat's
assistant turns. The guard sits after the template has taken the last message as its last query; every
other refusal is still said as the template said it."""

from __future__ import annotations

import pytest
from server import templated_prompt

# the Qwen templates' shape: the last user message that is no tool result is the last query, the last
# message until one is found; none found is refused; reasoning is written for turns after the last query
QUERY_GUARDED = (
    "{%- set ns = namespace(searching=true, last_query=messages|length - 1) -%}"
    "{%- for m in messages[::-1] -%}"
    "{%- if ns.searching and m.role == 'user' and not m.content.startswith('<tool_response>') -%}"
    "{%- set ns.searching = false -%}{%- set ns.last_query = (messages|length - 1) - loop.index0 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if ns.searching -%}{{- raise_exception('No user query found in messages.') }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query -%}{{ '<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' }}{%- endif -%}"
    "{{ (m.content or '') }}{%- for c in m.tool_calls or [] -%}{{ '<tool_call>' + c.function.name + '</tool_call>' }}{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif -%}"
)
SYSTEM_ONLY = [{"role": "system", "content": "Summarize: the build failed twice, then passed."}]
COMPACTED = [
    {"role": "system", "content": "You are a coding agent."},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Run the tests.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "3 passed"},
]
ASSISTANT_ONLY = [
    {"role": "system", "content": "Panel."},
    {"role": "assistant", "content": "Expert A: done."},
]


@pytest.mark.parametrize(
    "messages,expected",
    [
        (SYSTEM_ONLY, "<|im_start|>system\nSummarize: the build failed twice, then passed.<|im_end|>\n"),
        (
            COMPACTED,
            "<|im_start|>system\nYou are a coding agent.<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>run_tests</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n3 passed\n</tool_response><|im_end|>\n",
        ),
        (
            ASSISTANT_ONLY,
            "<|im_start|>system\nPanel.<|im_end|>\n<|im_start|>assistant\nExpert A: done.<|im_end|>\n",
        ),
    ],
)
def test_a_conversation_without_a_user_message_renders_as_sent(messages, expected):
    code, prompt = templated_prompt(QUERY_GUARDED, messages)
    assert code == 200, prompt
    assert prompt == expected + "<|im_start|>assistant\n<think>\n"


def test_a_conversation_with_a_user_message_renders_as_the_template_writes_it():
    messages = [{"role": "user", "content": "Test it."}] + COMPACTED[1:]
    code, prompt = templated_prompt(QUERY_GUARDED, messages)
    assert code == 200 and "<think>\nRun the tests.\n</think>" in prompt  # (after the last query)


def test_another_refusal_is_still_a_400():
    refusing = QUERY_GUARDED.replace("No user query found in messages.", "Tool results need a call.")
    code, text = templated_prompt(refusing, SYSTEM_ONLY)
    assert code == 400 and "Tool results need a call." in text
