"""vLLM's return_token_ids (engine/api/token_ids.py): the prompt's and each choice's token ids, whole in a
reply, and streamed so that the chunks' ids add up to the reply's; none unless asked."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "Name three colours."}],
    "max_tokens": 12,
    "temperature": 0,
}
COMPLETION = {
    "model": "m",
    "prompt": ["Once upon a time", "The capital of France is"],
    "max_tokens": 8,
    "n": 2,
}


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=4)) as s:
        yield s


def _post(server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _chunks(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.url}{path}", json={**body, "stream": True}, timeout=60) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_a_chat_reply_carries_the_prompts_and_its_token_ids_and_a_stream_adds_up_to_them(server):
    reply = _post(server, "/v1/chat/completions", {**CHAT, "return_token_ids": True})
    tokenizer = server.engine.tokenizer
    assert len(reply["prompt_token_ids"]) == reply["usage"]["prompt_tokens"]
    ids = reply["choices"][0]["token_ids"]
    assert len(ids) == reply["usage"]["completion_tokens"]
    assert tokenizer.decode(ids).strip() == reply["choices"][0]["message"]["content"].strip()
    chunks = _chunks(server, "/v1/chat/completions", {**CHAT, "return_token_ids": True})
    assert chunks[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    streamed = [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]
    assert streamed == ids
    plain = _post(server, "/v1/chat/completions", CHAT)
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert all(
        "token_ids" not in ch for c in _chunks(server, "/v1/chat/completions", CHAT) for ch in c["choices"]
    )


def test_completions_give_each_choice_its_prompt_and_tokens(server):
    reply = _post(server, "/v1/completions", {**COMPLETION, "return_token_ids": True, "temperature": 0})
    tokenizer = server.engine.tokenizer
    assert len(reply["choices"]) == 4
    for index, choice in enumerate(reply["choices"]):
        prompt = COMPLETION["prompt"][index // 2]
        assert tokenizer.decode(choice["prompt_token_ids"]).endswith(prompt)
        assert tokenizer.decode(choice["token_ids"]) == choice["text"]
    chunks = _chunks(server, "/v1/completions", {**COMPLETION, "return_token_ids": True, "temperature": 0})
    for index, choice in enumerate(reply["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["prompt_token_ids"] == choice["prompt_token_ids"]
        assert all("prompt_token_ids" not in m for m in mine[1:])
        assert [t for m in mine for t in m["token_ids"]] == choice["token_ids"]
