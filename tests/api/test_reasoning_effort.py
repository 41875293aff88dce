"""A reasoning effort the chat template does not take is sent as the nearest one it does (a tie: the
higher): Qwen3.8's template takes xhigh, medium and low and raises for any other, so an agent's `high`
(Claude Code's output_config.effort, Codex's reasoning.effort) was a 400 on every request."""

from __future__ import annotations

from dataclasses import replace

import anthropic
import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.chat_template import with_taken_effort

# Qwen3.8's rule, in a small template: thinking on, the effort (xhigh by default) must be one of three,
# and it is written into the prompt
THREE_EFFORTS = (
    "{%- if enable_thinking is undefined or enable_thinking is true -%}"
    "{%- set effort = reasoning_effort|default('xhigh') -%}"
    "{%- if effort not in ('xhigh', 'medium', 'low') -%}"
    "{{ raise_exception('Unexpected reasoning effort ' ~ reasoning_effort ~ '.') }}"
    "{%- endif -%}"
    "{{ '<|im_start|>system\\nEffort: ' + effort + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
READS_NONE = "{%- for m in messages -%}{{ m.content }}{%- endfor -%}"
TAKES_ANY = THREE_EFFORTS.replace("effort not in ('xhigh', 'medium', 'low')", "false")


@pytest.mark.parametrize(
    "sent,taken",
    [
        ("xhigh", "xhigh"),
        ("medium", "medium"),
        ("low", "low"),
        ("high", "xhigh"),  # between medium and xhigh: the higher
        ("max", "xhigh"),
        ("minimal", "low"),
        ("none", "low"),
    ],
)
def test_the_nearest_effort_the_template_takes(sent, taken):
    assert with_taken_effort(THREE_EFFORTS, {"reasoning_effort": sent}) == {"reasoning_effort": taken}


@pytest.mark.parametrize("template", [READS_NONE, TAKES_ANY])
def test_a_template_that_takes_the_effort_or_reads_none_gets_it_as_sent(template):
    assert with_taken_effort(template, {"reasoning_effort": "high"}) == {"reasoning_effort": "high"}
    assert with_taken_effort(template, {"reasoning_effort": "unheard-of"}) == {
        "reasoning_effort": "unheard-of"
    }
    assert with_taken_effort(template, {}) == {}


def test_agents_asking_for_high_effort_are_answered():
    engine = ScriptedEngine(["ok"] * 2)
    engine.tokenizer = replace(engine.tokenizer, chat_template=THREE_EFFORTS)
    ask = [{"role": "user", "content": "Fix the bug."}]
    with RunningServer(engine) as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        claude.messages.create(
            model="m",
            max_tokens=50,
            messages=ask,
            thinking={"type": "adaptive"},
            extra_body={"output_config": {"effort": "high"}},
        )
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=ask, reasoning_effort="high")
    assert [p.split("<|im_end|>")[0] for p in engine.prompts] == ["<|im_start|>system\nEffort: xhigh"] * 2
