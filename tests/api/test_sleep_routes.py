"""Sleep over HTTP (vLLM's routes, llama-server's /props field): POST /sleep gives the device memory back,
the next request (or POST /wake_up) takes it again, the prefix cache still hits after level 1; the routes
are behind the key, bad levels and sleeping under load are refused in a sentence."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

KEY = "sleep-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = [{"role": "user", "content": "Describe the river Seine in Paris, its bridges and its banks. " * 6}]


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_context=2048), api_key=KEY) as s:
        yield s


def _ask(server) -> openai.types.chat.ChatCompletion:
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    return oai.chat.completions.create(model="smollm2", messages=LONG, max_tokens=4, temperature=0)


def _sleeping(server) -> bool:
    return httpx.get(f"{server.url}/is_sleeping").json()["is_sleeping"]


def test_sleep_then_a_request_wakes_the_server_with_its_prefix_cache(server):
    first = _ask(server)
    assert httpx.post(f"{server.url}/sleep").status_code == 401  # behind the key
    r = httpx.post(f"{server.url}/sleep?level=1", headers=AUTH)
    assert r.status_code == 200 and r.json()["is_sleeping"] is True and r.json()["level"] == 1
    assert r.json()["message"].startswith("asleep (level 1): ")
    assert _sleeping(server) and httpx.get(f"{server.url}/props", headers=AUTH).json()["is_sleeping"] is True
    assert "ninfer_sleep_level 1.0" in httpx.get(f"{server.url}/metrics").text
    assert httpx.get(f"{server.url}/health").status_code == 200  # answered asleep, without waking
    r = httpx.post(f"{server.url}/sleep?level=1", headers=AUTH)  # already asleep: the level it sleeps at
    assert r.json() == {"is_sleeping": True, "level": 1, "message": "already asleep (level 1)"}
    assert _sleeping(server)
    again = _ask(server)
    assert not _sleeping(server)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # level 1 kept the prefix cache
    r = httpx.post(f"{server.url}/wake_up", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"is_sleeping": False, "message": "awake"}


def test_level_2_drops_the_prefix_cache(server):
    _ask(server)
    assert httpx.post(f"{server.url}/sleep?level=2", headers=AUTH).json()["level"] == 2
    assert httpx.get(f"{server.url}/is_sleeping").json() == {"is_sleeping": True, "level": 2}
    r = httpx.post(f"{server.url}/wake_up", headers=AUTH)
    assert r.status_code == 200 and r.json()["message"].startswith("awake in ")
    assert _ask(server).usage.prompt_tokens_details.cached_tokens == 0
    # asleep at level 1 (as an idle server falls asleep), then level 2 asked for: deepened in place
    _ask(server)
    assert httpx.post(f"{server.url}/sleep?level=1", headers=AUTH).json()["level"] == 1
    r = httpx.post(f"{server.url}/sleep?level=2", headers=AUTH).json()
    assert r["level"] == 2 and "of host memory freed, the prefix cache dropped" in r["message"], r
    assert _ask(server).usage.prompt_tokens_details.cached_tokens == 0


def test_a_bad_level_and_sleep_under_load_are_refused(server):
    r = httpx.post(f"{server.url}/sleep?level=3", headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "level"
    assert r.json()["error"]["message"].startswith("level '3' is not 1 (weights, KV pool and prefix cache")
    body = {"model": "smollm2", "messages": LONG, "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH) as stream:
        lines = stream.iter_lines()  # (kept: a dropped iterator would close the stream)
        next(line for line in lines if line.startswith("data: "))  # running now
        r = httpx.post(f"{server.url}/sleep", headers=AUTH)
        assert r.status_code == 409
        assert r.json()["error"]["message"] == "1 request(s) are running or waiting; sleep once they finish"
    server.wait_idle()
    assert not _sleeping(server)
