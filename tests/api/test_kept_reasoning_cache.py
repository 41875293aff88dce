"""An agent's tool loop with thinking, then a new user message, on the real engine: where the chat template
can keep every turn's reasoning (Qwen3.6's `preserve_thinking`), the new message's prompt extends the
loop's last one, so the prefix cache serves all of it; dropped (the template's own default), the prompt
parts from it at the loop's first assistant turn and the tool results after it are computed again."""

from __future__ import annotations

import uuid
from dataclasses import replace

import httpx2 as httpx
import pytest
from conftest import PRESERVING_TEMPLATE
from server import RunningServer

from engine.async_llm import AsyncLLM

RESULT = "def parse(tokens):\n    return [t for t in tokens[:-1]]\n" * 12


def _loop(nonce: str) -> list[dict]:
    """A user request, then two tool calls (each with its reasoning) and their results."""
    messages = [{"role": "user", "content": f"[{nonce}] Fix the bug in parse()."}]
    for i in range(2):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {
                "role": "assistant",
                "content": f"Reading part {i}.",
                "reasoning_content": f"Part {i} first.",
                "tool_calls": [call],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": RESULT},
        ]
    return messages


@pytest.fixture(scope="module")
def server():
    engine = AsyncLLM(max_concurrency=1, max_context=4096)
    engine.tokenizer = replace(engine.tokenizer, chat_template=PRESERVING_TEMPLATE)
    with RunningServer(engine) as s:
        yield s


def _send(server, messages, **extra) -> dict:
    body = {"model": "m", "messages": messages, "max_tokens": 1, **extra}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]


@pytest.mark.parametrize("kept", [True, False])
def test_a_new_user_message_after_a_tool_loop_reads_the_loop_from_the_cache(server, kept):
    extra = {} if kept else {"chat_template_kwargs": {"preserve_thinking": False}}
    loop = _loop(uuid.uuid4().hex)
    last = _send(server, loop, **extra)  # the loop's last request (its reasoning written: after the user's)
    turn = [
        *loop,
        {"role": "assistant", "content": "Fixed.", "reasoning_content": "It drops the last token."},
        {"role": "user", "content": "Now add a test."},
    ]
    usage = _send(server, turn, **extra)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    if kept:  # all of the loop's prompt, to its last full page
        assert cached >= last["prompt_tokens"] - 16
    else:  # up to the loop's first assistant turn: the tool results are computed again
        assert cached < last["prompt_tokens"] // 4
