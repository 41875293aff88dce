"""`max_tokens: 0` on the Messages API pre-warms the prompt cache (as on Anthropic's API): on the real engine
the prompt is computed and kept, no reply is written, and the first real turn reads it from the cache."""

from __future__ import annotations

import uuid

import anthropic
import httpx2 as httpx
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

SYSTEM = "You are a careful coding agent. Follow the repository's conventions. " * 20


@pytest.fixture(scope="module")
def claude():
    with RunningServer(AsyncLLM(max_concurrency=1, max_context=4096)) as server:
        yield anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0), server.url


@pytest.mark.parametrize("stream", [False, True])
def test_a_zero_token_request_warms_the_cache_and_writes_nothing(claude, stream):
    client, _ = claude
    system = f"[{uuid.uuid4().hex}] {SYSTEM}"  # (a prefix no earlier test computed)
    ask = [{"role": "user", "content": "ping"}]
    if stream:
        with client.messages.stream(model="m", max_tokens=0, system=system, messages=ask) as s:
            kinds = [e.type for e in s]
            warm = s.get_final_message()
        assert kinds == ["message_start", "message_delta", "message_stop"]
    else:
        warm = client.messages.create(model="m", max_tokens=0, system=system, messages=ask)
    assert warm.content == [] and warm.stop_reason == "max_tokens"
    assert warm.usage.output_tokens == 0 and warm.usage.input_tokens > 200
    assert warm.usage.cache_read_input_tokens == 0
    first = client.messages.create(
        model="m", max_tokens=2, system=system, messages=[{"role": "user", "content": "Fix the bug."}]
    )
    assert first.usage.cache_read_input_tokens >= 200  # the system prompt, from the warm-up


def test_a_negative_max_tokens_is_refused(claude):
    _, url = claude
    body = {"model": "m", "max_tokens": -1, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(f"{url}/v1/messages", json=body, timeout=30)
    assert reply.status_code == 400 and "max_tokens must be at least 0" in reply.json()["error"]["message"]
