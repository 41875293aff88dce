"""llama-server's `timings` on OpenAI chat completions (engine/api/timings.py): the reply's, or a stream's
finishing chunk's; cache_n + prompt_n is the prompt, predicted_n the reply; none for several choices."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8}
KEYS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=2)) as s:
        yield s


def test_a_reply_carries_its_timings_and_the_context_it_used(server):
    first = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60).json()
    timings, usage = first["timings"], first["usage"]
    assert set(timings) == KEYS
    assert timings["cache_n"] + timings["prompt_n"] == usage["prompt_tokens"]
    assert timings["predicted_n"] == usage["completion_tokens"]
    assert timings["prompt_ms"] > 0 and timings["prompt_per_second"] > 0
    again = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60).json()["timings"]
    assert again["cache_n"] > 0 and again["cache_n"] + again["prompt_n"] == usage["prompt_tokens"]


def test_a_streams_finishing_chunk_carries_them(server):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishing) == 1 and set(finishing[0]["timings"]) == KEYS
    assert all("timings" not in c for c in chunks if c is not finishing[0])
    usage = chunks[-1]["usage"]
    assert finishing[0]["timings"]["predicted_n"] == usage["completion_tokens"]


def test_several_choices_have_none(server):
    reply = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "n": 2}, timeout=60).json()
    assert len(reply["choices"]) == 2 and "timings" not in reply


def test_speculative_decodings_drafts_are_counted_as_llama_server_counts_them():
    from engine.api.timings import Clock
    from engine.request import RequestOutput

    clock = Clock()
    out = RequestOutput("r", None, [1, 2, 3, 4], [5, 6, 7], "", None, "stop", num_cached_tokens=2)
    clock.token(out)
    plain = clock.timings(out)
    assert (plain["cache_n"], plain["prompt_n"], plain["predicted_n"]) == (2, 2, 3) and "draft_n" not in plain
    drafted = RequestOutput(
        "r", None, [1, 2], [5, 6, 7], "", None, "stop", num_draft_tokens=6, num_accepted_tokens=4
    )
    timings = clock.timings(drafted, prompt_tokens=9)
    assert (timings["prompt_n"], timings["draft_n"], timings["draft_n_accepted"]) == (9, 6, 4)


@pytest.fixture(scope="module")
def chunked():
    """Prompts run in chunks of 32 tokens: a long one reports its progress between them."""
    with RunningServer(AsyncLLM(max_concurrency=2, prefill_chunk=32)) as s:
        yield s


LONG = "Count the words in this sentence, please: " + "one two three four five six seven eight " * 12


def _events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_return_progress_streams_the_prompts_progress_on_completion_and_chat(chunked):
    events = _events(
        chunked.url, "/completion", {"prompt": LONG, "n_predict": 3, "stream": True, "return_progress": True}
    )
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert len(progress) >= 2 and set(progress[0]) == {"total", "cache", "processed", "time_ms"}
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert all(p["processed"] < p["total"] == events[-1]["tokens_evaluated"] for p in progress)
    assert events.index(next(e for e in events if "prompt_progress" in e)) == 0  # before any text
    assert "".join(e["content"] for e in events) == events[-1]["content"] or events[-1]["stop"]
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": LONG + "x"}],
        "max_tokens": 3,
        "stream": True,
        "return_progress": True,
    }
    chunks = _events(chunked.url, "/v1/chat/completions", chat)
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress and all(c["choices"] == [] for c in progress)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    import openai

    client = openai.OpenAI(base_url=f"{chunked.url}/v1", api_key="x", max_retries=0)
    parsed = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Again: " + LONG}],  # not cached
            max_tokens=3,
            stream=True,
            extra_body={"return_progress": True},
        )
    )
    assert any(c.model_extra.get("prompt_progress") for c in parsed)  # the SDK reads them as chunks


def test_without_return_progress_or_without_a_stream_there_is_none(chunked):
    events = _events(chunked.url, "/completion", {"prompt": LONG + "y", "n_predict": 3, "stream": True})
    assert not any("prompt_progress" in e for e in events)
    reply = httpx.post(
        f"{chunked.url}/completion",
        json={"prompt": LONG + "z", "n_predict": 3, "return_progress": True},
        timeout=60,
    ).json()
    assert "prompt_progress" not in reply and reply["stop"]
