"""A stream whose first token is long in coming (a long prompt prefilling) sends keep-alives meanwhile (an
SSE comment; Anthropic's ping), which the official SDKs skip; a client that leaves during the wait frees
its request."""

from __future__ import annotations

import time

import anthropic
import httpx2 as httpx
import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

import engine.api.common as common

REPLY = "Paris is the capital of France."
ASK = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture(autouse=True)
def quick_keepalives(monkeypatch):
    monkeypatch.setattr(common, "KEEPALIVE_S", 0.05)


def test_openai_streams_keepalive_comments_before_the_first_token():
    with RunningServer(ScriptedEngine([REPLY, REPLY, REPLY], delay=0.4)) as server:
        body = {"model": "m", "messages": ASK, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
            lines = [line for line in r.iter_lines() if line]
        first_text = next(i for i, line in enumerate(lines) if '"content": "Par' in line)
        assert lines.count(": keep-alive") >= 3 and lines.index(": keep-alive") < first_text
        assert ": keep-alive" not in lines[first_text:]  # (the scripted reply then comes without pause)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        chunks = client.chat.completions.create(model="m", messages=ASK, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY
        text = client.completions.create(model="m", prompt="Capital of France?", stream=True)
        assert "".join(c.choices[0].text for c in text) == REPLY


def test_anthropic_pings_while_waiting():
    with RunningServer(ScriptedEngine([REPLY, REPLY], delay=0.4)) as server:
        body = {"model": "m", "max_tokens": 50, "messages": ASK, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/messages", json=body, timeout=30) as r:
            kinds = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
        assert kinds[:2] == ["message_start", "ping"] and kinds.count("ping") >= 4
        assert kinds.index("content_block_start") > 3  # the pings came while waiting
        claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
        with claude.messages.stream(model="m", max_tokens=50, messages=ASK) as s:
            assert s.get_final_message().content[0].text == REPLY


def test_a_client_that_leaves_during_the_wait_frees_its_request():
    engine = ScriptedEngine([REPLY], delay=5.0)
    with RunningServer(engine) as server:
        body = {"model": "m", "messages": ASK, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line == ": keep-alive":
                    break
        deadline = time.monotonic() + 5
        while not engine.streams[0].aborted:
            assert time.monotonic() < deadline, "the request was not aborted"
            time.sleep(0.02)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/responses", {"model": "m", "input": "Capital of France?", "stream": True}),
        ("/completion", {"prompt": "Capital of France?", "stream": True}),
    ],
)
def test_the_responses_api_and_llama_cpp_streams_keep_alive_too(path, body):
    with RunningServer(ScriptedEngine([REPLY], delay=0.4)) as server:
        with httpx.stream("POST", server.url + path, json=body, timeout=30) as r:
            lines = [line for line in r.iter_lines() if line]
        assert lines.count(": keep-alive") >= 3 and "Par" in "".join(lines)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"model": "m", "messages": ASK, "stream": True}),
        ("/v1/completions", {"model": "m", "prompt": "Capital?", "stream": True}),
        ("/v1/messages", {"model": "m", "max_tokens": 500, "messages": ASK, "stream": True}),
        ("/v1/responses", {"model": "m", "input": "Capital?", "stream": True}),
        ("/completion", {"prompt": "Capital?", "stream": True}),
    ],
)
def test_a_client_that_leaves_mid_reply_frees_its_request_at_once(path, body):
    """Left while tokens flow (the route waiting on the client, not on the engine): the request is
    aborted then, not when the reply would have ended."""
    engine = ScriptedEngine(["word " * 400], piece=5, pace=0.01)  # 4 s of reply
    with RunningServer(engine) as server:
        with httpx.stream("POST", server.url + path, json=body, timeout=30) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n == 8:
                    break
        left = time.monotonic()
        while not engine.streams[0].aborted:
            assert time.monotonic() - left < 2, "the request was not aborted when the client left"
            time.sleep(0.02)
