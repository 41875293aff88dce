"""Ollama's `keep_alive` on every request (engine/api/ollama_keep_alive.py): read as Ollama reads it, set on
the engine once the request is in, and the engine sleeps after that long idle (0: once the work is done,
negative: never; none: the server's --sleep-idle-seconds); /api/ps lists a sleeping model as unloaded and
says when an awake one would be."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import datetime, timezone

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api.errors import ApiError
from engine.api.ollama_keep_alive import NEVER, keep_alive_seconds
from engine.async_llm import AsyncLLM
from engine.errors import NinferError

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "stream": False}


@pytest.mark.parametrize(
    "value, seconds",
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        (" 0m ", 0.0),
        (300, 300.0),
        (2.5, 2.5),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("2m30.5s", 150.5),
        ("+10s", 10.0),
        (-1, math.inf),
        ("-1", math.inf),
        ("-1m", math.inf),
        ("-0.5h", math.inf),
    ],
)
def test_values_are_read_as_ollama_reads_them(value, seconds):
    expected = seconds if seconds is None or math.isinf(seconds) else pytest.approx(seconds)
    assert keep_alive_seconds(value) == expected


@pytest.mark.parametrize(
    "value", ["", "5 minutes", "m", "1d", "5m-3s", "--1m", "1h 30m", True, [], {}, math.nan]
)
def test_other_values_are_refused_in_one_sentence(value):
    with pytest.raises(ApiError) as e:
        keep_alive_seconds(value)
    assert e.value.status == 400 and "'keep_alive' must be" in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize(
    "path, body", [("/api/chat", CHAT), ("/api/generate", {"prompt": "Hi", "stream": False})]
)
def test_each_request_sets_the_engines_keep_alive_once_it_is_in(path, body):
    engine = ScriptedEngine(["one", "two", "three", "four"])
    with RunningServer(engine) as server:
        for value in ("10m", None, -1, 0):
            sent = body if value is None else {**body, "keep_alive": value}
            assert httpx.post(server.url + path, json=sent, timeout=30).status_code == 200
        assert engine.keep_alives == [600.0, None, math.inf, 0.0]
        r = httpx.post(server.url + path, json={**body, "keep_alive": "soon"}, timeout=30)
        assert r.status_code == 400 and set(r.json()) == {"error"} and "'keep_alive'" in r.json()["error"]
        assert len(engine.prompts) == 4 and len(engine.keep_alives) == 4  # the refused one ran nothing


def test_embed_sets_it_too():
    with RunningServer(AsyncLLM(max_context=512)) as server:
        body = {"model": "smollm2", "input": "a cat", "keep_alive": "2h"}
        assert httpx.post(server.url + "/api/embed", json=body, timeout=60).status_code == 200
        assert _expires_in(server) == pytest.approx(7200, abs=60)


def test_a_real_engine_sleeps_after_its_keep_alive_and_the_next_request_wakes_it():
    with RunningServer(AsyncLLM(max_context=1024)) as server:
        # greedy: two sampled tokens can be half a character, withheld at a length stop (an empty reply)
        ask = {**CHAT, "options": {"num_predict": 2, "temperature": 0}}
        assert _ps(server)[0]["expires_at"] == NEVER  # no --sleep-idle-seconds: never unloaded
        r = httpx.post(server.url + "/api/chat", json={**ask, "keep_alive": 0}, timeout=60)
        assert r.json()["done"] and r.json()["message"]["content"]
        assert _until(lambda: httpx.get(server.url + "/is_sleeping").json()["is_sleeping"])
        assert _ps(server) == []  # unloaded, as Ollama lists it
        r = httpx.post(server.url + "/api/chat", json={**ask, "keep_alive": "1h"}, timeout=60)
        assert r.json()["done"] and not httpx.get(server.url + "/is_sleeping").json()["is_sleeping"]
        assert _expires_in(server) == pytest.approx(3600, abs=60)
        r = httpx.post(
            server.url + "/api/generate", json={"model": "smollm2", "keep_alive": "1s"}, timeout=60
        )
        assert r.json()["done_reason"] == "load"  # a load with a keep_alive: it holds from then on
        assert _until(lambda: httpx.get(server.url + "/is_sleeping").json()["is_sleeping"])
        r = httpx.post(server.url + "/api/chat", json={**ask, "keep_alive": -1}, timeout=60)
        assert r.json()["done"] and _ps(server)[0]["expires_at"] == NEVER
        for beyond in (
            1e30,
            "99999999999h",
        ):  # past what a thread can wait: for good, as -1 (the engine lives)
            r = httpx.post(server.url + "/api/chat", json={**ask, "keep_alive": beyond}, timeout=60)
            assert r.json()["done"] and _ps(server)[0]["expires_at"] == NEVER
        r = httpx.post(server.url + "/api/chat", json=ask, timeout=60)  # none: the server's own again
        assert _ps(server)[0]["expires_at"] == NEVER


def test_the_engine_refuses_a_negative_keep_alive():
    engine = AsyncLLM(max_context=256)
    try:
        with pytest.raises(NinferError, match="0 or more seconds"):
            asyncio.run(engine.keep_alive(-1.0))
    finally:
        engine.shutdown()


def _ps(server) -> list[dict]:
    return httpx.get(server.url + "/api/ps", timeout=30).json()["models"]


def _expires_in(server) -> float:
    at = datetime.fromisoformat(_ps(server)[0]["expires_at"].replace("Z", "+00:00"))
    return (at - datetime.now(timezone.utc)).total_seconds()


def _until(check, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
