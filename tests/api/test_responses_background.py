"""Responses' `background: true` (engine/api/response_background.py): answered at once as queued, polled
until completed; cancelled (its engine request aborted) or deleted while running; a failure stored as
failed; a follow-up on a response still running is refused in a sentence."""

from __future__ import annotations

import time

import httpx2 as httpx
import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.async_llm import AsyncLLM


def _poll(client: openai.OpenAI, rid: str, until=("completed", "incomplete", "failed", "cancelled")):
    deadline = time.monotonic() + 60
    while True:
        response = client.responses.retrieve(rid)
        if response.status in until:
            return response
        assert time.monotonic() < deadline, f"still {response.status}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=2)) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def test_a_background_response_is_queued_then_polled_to_its_end(server, client):
    ask = "What is the capital of France?"
    queued = client.responses.create(
        model="m", input=ask, background=True, max_output_tokens=24, temperature=0
    )
    assert queued.status == "queued" and queued.background and queued.output == []
    done = _poll(client, queued.id)
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.usage.output_tokens > 0 and done.background
    # the same reply as in the foreground, and a follow-up chains on it
    foreground = client.responses.create(model="m", input=ask, max_output_tokens=24, temperature=0)
    assert foreground.output_text == done.output_text
    follow = client.responses.create(
        model="m", input="And of Spain?", previous_response_id=done.id, max_output_tokens=8
    )
    assert follow.status in ("completed", "incomplete")
    server.wait_idle()


def test_cancelling_a_running_background_response_aborts_it(server, client):
    queued = client.responses.create(
        model="m", input="Count to a thousand.", background=True, max_output_tokens=3000
    )
    _poll(client, queued.id, until=("in_progress",))
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"
    server.wait_idle(5)  # the engine request went with it
    assert client.responses.cancel(queued.id).status == "cancelled"  # again: as it is


def test_deleting_a_running_background_response_aborts_it(server, client):
    queued = client.responses.create(
        model="m", input="Count to a thousand.", background=True, max_output_tokens=3000
    )
    _poll(client, queued.id, until=("in_progress",))
    client.responses.delete(queued.id)
    server.wait_idle(5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(queued.id)


def test_a_follow_up_on_a_running_response_and_cancelling_a_foreground_one_are_refused(server, client):
    queued = client.responses.create(
        model="m", input="Count to a thousand.", background=True, max_output_tokens=3000
    )
    with pytest.raises(openai.BadRequestError, match="is still running in the background"):
        client.responses.create(model="m", input="next", previous_response_id=queued.id)
    client.responses.cancel(queued.id)
    done = client.responses.create(model="m", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="was not made with background: true"):
        client.responses.cancel(done.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")
    server.wait_idle(5)


def test_a_failed_background_response_is_stored_as_failed():
    engine = ScriptedEngine(["never sent"])

    async def expired(*args, **kwargs):
        stream = await ScriptedEngine.add_request(engine, *args, **kwargs)

        async def run():
            yield (
                stream.output.__class__(
                    stream.request_id, None, [], [], "", None, "error", error="the engine failed (boom)"
                ),
                "",
            )

        stream._run = run
        return stream

    engine.add_request = expired
    with RunningServer(engine) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        queued = client.responses.create(model="m", input="Hi", background=True)
        failed = _poll(client, queued.id)
        assert failed.status == "failed" and failed.error.message == "the engine failed (boom)"
        assert httpx.get(f"{s.url}/health").json()["status"] == "ok"
