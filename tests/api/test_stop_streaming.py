"""Stop strings across token boundaries, streamed: a tail that may still become a stop string is held back
until it cannot, so what a stream sends is what the whole reply holds (never the first half of a stop
string the next token completes), on every route that streams text."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

PROMPT = "Repeat exactly:\ndef area(w, h):\n    return w * h\n\n"


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM()) as s:
        yield s


@pytest.fixture(scope="module")
def boundary_stops(server) -> list[tuple[str, str]]:
    """(stop, the reply before it): two-character stop strings made of the last character of a token and
    the first of the next, each first found at that boundary in the greedy reply."""
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    reply = oai.completions.create(model="m", prompt=PROMPT, max_tokens=16, temperature=0, logprobs=0)
    tokens = reply.choices[0].logprobs.tokens
    full, at, stops = "".join(tokens), 0, []
    for a, b in zip(tokens, tokens[1:]):
        at += len(a)
        stop = a[-1:] + b[:1]
        if len(stop) == 2 and full.find(stop) == at - 1:
            stops.append((stop, full[: at - 1]))
    assert len(stops) >= 3, tokens
    return stops[:4]


def _lines(r) -> list[dict]:
    out = []
    for line in r.iter_lines():
        line = line.removeprefix("data: ")
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


ROUTES = {  # path, body, the text field of a whole reply, of a streamed chunk
    "llama.cpp": ("/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0}),
    "ollama": (
        "/api/generate",
        {"model": "m", "prompt": PROMPT, "raw": True, "options": {"num_predict": 16, "temperature": 0}},
    ),
    "openai": ("/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 16, "temperature": 0}),
}


def _text(route: str, j: dict) -> str:
    if route == "llama.cpp":
        return j.get("content", "")
    if route == "ollama":
        return j.get("response", "")
    return "".join(c.get("text", "") for c in j.get("choices", []))


@pytest.mark.parametrize("route", ROUTES)
def test_a_stream_never_sends_the_start_of_a_stop_string_the_next_token_completes(
    server, boundary_stops, route
):
    path, body = ROUTES[route]
    for stop, before in boundary_stops:
        if route == "ollama":
            ask = {**body, "options": {**body["options"], "stop": [stop]}}
        else:
            ask = {**body, "stop": [stop]}
        whole = httpx.post(f"{server.url}{path}", json={**ask, "stream": False}, timeout=120).json()
        assert _text(route, whole) == before, stop
        with httpx.stream("POST", f"{server.url}{path}", json={**ask, "stream": True}, timeout=120) as r:
            streamed = "".join(_text(route, j) for j in _lines(r))
        assert streamed == before, (stop, streamed)
