"""A request's prompt is rendered and encoded in a worker thread, not on the server's event loop: a
conversation of 250K tokens takes ~0.5 s to encode, and meanwhile every running stream's chunks (and any
other client) would wait (benchmarks/long_prompt_stall.py); so are long decodes (/detokenize, /tokenize's
pieces). Here the tokenizer holds the marked call until the server has answered another client."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import requests
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.tokenizer import Tokenizer

MARK = "encode-me-slowly"
REPLY = "Done."
CHAT = [{"role": "user", "content": f"Read this: {MARK}"}]
HELD_IDS = [101, 102, 103]

ROUTES = {
    "openai chat": ("/v1/chat/completions", {"model": "m", "messages": CHAT}),
    "openai completions": ("/v1/completions", {"model": "m", "prompt": MARK}),
    "openai chat prediction": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "prediction": {"type": "content", "content": MARK},
        },
    ),
    "anthropic messages": ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": CHAT}),
    "anthropic count_tokens": ("/v1/messages/count_tokens", {"model": "m", "messages": CHAT}),
    "responses": ("/v1/responses", {"model": "m", "input": f"Read this: {MARK}"}),
    "responses input_tokens": ("/v1/responses/input_tokens", {"model": "m", "input": MARK}),
    "ollama chat": ("/api/chat", {"model": "m", "messages": CHAT, "stream": False}),
    "ollama generate raw": ("/api/generate", {"model": "m", "prompt": MARK, "raw": True, "stream": False}),
    "llama.cpp completion": ("/completion", {"prompt": MARK, "n_predict": 8}),
    "tokenize messages": ("/tokenize", {"messages": CHAT}),
    "tokenize prompt": ("/tokenize", {"prompt": MARK}),
    "tokenize content": ("/tokenize", {"content": MARK}),
    # decoding: the held call is the decode of HELD_IDS (with pieces: of its last token alone)
    "tokenize content with pieces": ("/tokenize", {"content": "x y", "with_pieces": True}),
    "detokenize": ("/detokenize", {"tokens": HELD_IDS}),
    # fill-in-the-middle (the tokenizer with Qwen's FIM tokens)
    "llama.cpp infill": ("/infill", {"input_prefix": MARK, "input_suffix": "x", "n_predict": 8}),
    "openai completions suffix": ("/v1/completions", {"model": "m", "prompt": "x", "suffix": MARK}),
    "ollama generate suffix": (
        "/api/generate",
        {"model": "m", "prompt": "x", "suffix": MARK, "stream": False},
    ),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_the_event_loop_answers_others_while_a_request_is_tokenized(route, monkeypatch, fim_tokenizer):
    path, body = ROUTES[route]
    entered, release = threading.Event(), threading.Event()
    encode = Tokenizer.encode

    decode = Tokenizer.decode
    last_piece = [Tokenizer.encode(ScriptedEngine([]).tokenizer, "x y", False)[-1]]

    def hold() -> None:
        entered.set()
        assert release.wait(30), "the test never let the call go on"

    def held(self, text, add_special_tokens=True):
        if MARK in text:
            hold()
        return encode(self, text, add_special_tokens)

    def held_decode(self, ids, skip_special_tokens=True):
        if list(ids) in (HELD_IDS, last_piece):
            hold()
        return decode(self, ids, skip_special_tokens)

    monkeypatch.setattr(Tokenizer, "encode", held)
    monkeypatch.setattr(Tokenizer, "decode", held_decode)
    engine = ScriptedEngine([REPLY])
    if "suffix" in route or "infill" in route:
        engine.tokenizer = replace(fim_tokenizer, chat_template=engine.tokenizer.chat_template)
    with RunningServer(engine) as server:
        answer = {}

        def send() -> None:
            answer["reply"] = requests.post(f"{server.url}{path}", json=body, timeout=60)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            assert entered.wait(30), f"{path} never encoded the prompt"
            # the prompt's encoding is held: another client is answered meanwhile (on the event loop, this
            # request would time out)
            assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
        finally:
            release.set()
            sender.join(60)
        reply = answer["reply"]
        assert reply.status_code == 200, reply.text
        assert REPLY in reply.text or {"count", "input_tokens", "content"} & set(reply.json())
