"""Responses' `background: true` (engine/api/response_background.py): answered at once as queued, polled
until completed; cancelled (its engine request aborted) or deleted while running; a failure stored as
failed; a follow-up on a response still running is refused in a sentence."""

from __future__ import annotations

import json
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
        model="m",
        input="Count to a thousand.",
        background=True,
        max_output_tokens=3000,
        extra_body={"ignore_eos": True},  # (runs until cancelled: no sampled end first)
    )
    _poll(client, queued.id, until=("in_progress",))
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"
    server.wait_idle(5)  # the engine request went with it
    assert client.responses.cancel(queued.id).status == "cancelled"  # again: as it is


def test_deleting_a_running_background_response_aborts_it(server, client):
    queued = client.responses.create(
        model="m",
        input="Count to a thousand.",
        background=True,
        max_output_tokens=3000,
        extra_body={"ignore_eos": True},  # (runs until cancelled: no sampled end first)
    )
    _poll(client, queued.id, until=("in_progress",))
    client.responses.delete(queued.id)
    server.wait_idle(5)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(queued.id)


def test_a_follow_up_on_a_running_response_and_cancelling_a_foreground_one_are_refused(server, client):
    queued = client.responses.create(
        model="m",
        input="Count to a thousand.",
        background=True,
        max_output_tokens=3000,
        extra_body={"ignore_eos": True},  # (runs until cancelled: no sampled end first)
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


def _failing_engine() -> ScriptedEngine:
    """An engine whose every request ends at once with a failed step's error."""
    engine = ScriptedEngine(["never sent"] * 4)

    async def failing(*args, **kwargs):
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

    engine.add_request = failing
    return engine


def test_a_failed_background_response_is_stored_as_failed():
    engine = _failing_engine()
    with RunningServer(engine) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        queued = client.responses.create(model="m", input="Hi", background=True)
        failed = _poll(client, queued.id)
        assert failed.status == "failed" and failed.error.message == "the engine failed (boom)"
        assert httpx.get(f"{s.url}/health").json()["status"] == "ok"


# -- background and stream: the events written by the task, followed by the request and by GETs ----------


def _events(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_a_streamed_background_response_can_be_followed_again_from_any_event(server, client):
    ask = "What is the capital of France?"
    events = list(
        client.responses.create(
            model="m", input=ask, background=True, stream=True, max_output_tokens=24, temperature=0
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0].response.status == "queued" and events[0].response.background
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    rid = events[0].response.id
    stored = client.responses.retrieve(rid)
    assert stored.status == kinds[-1].split(".")[1] and stored.output_text == text
    foreground = client.responses.create(model="m", input=ask, max_output_tokens=24, temperature=0)
    assert foreground.output_text == text
    again = list(client.responses.retrieve(rid, stream=True))  # all of it, replayed
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]
    tail = list(client.responses.retrieve(rid, stream=True, starting_after=4))
    assert [e.sequence_number for e in tail] == list(range(5, len(events)))
    server.wait_idle()


def test_a_client_that_loses_the_stream_does_not_stop_it_and_picks_it_up_where_it_was():
    engine = ScriptedEngine(["One two three four five six seven eight nine ten."], piece=2, pace=0.05)
    with RunningServer(engine) as s:
        body = {"model": "m", "input": "Count.", "background": True, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/responses", json=body, timeout=30) as r:
            assert r.status_code == 200
            seen = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen.append(line)
                if len(seen) == 5:  # created, queued, in_progress, an item added, and one more
                    break
        import json

        first = [json.loads(line[6:]) for line in seen]
        rid, last = first[0]["response"]["id"], first[-1]["sequence_number"]
        with httpx.stream(
            "GET", f"{s.url}/v1/responses/{rid}?stream=true&starting_after={last}", timeout=30
        ) as r:
            rest = _events(r)
        assert rest[0]["sequence_number"] == last + 1 and rest[-1]["type"] == "response.completed"
        deltas = [e["delta"] for e in first + rest if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == "One two three four five six seven eight nine ten."
        assert httpx.get(f"{s.url}/v1/responses/{rid}").json()["status"] == "completed"  # not stopped


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ("stream=true&starting_after=abc", 400, "'starting_after' must be a sequence number"),
        ("stream=true&starting_after=-3", 400, "'starting_after' must be a sequence number"),
        ("stream=true&starting_after=100000", 400, "'starting_after' is 100000, past the last event"),
    ],
)
def test_following_a_finished_stream_past_its_end_or_from_nonsense_is_refused(
    server, client, query, status, message
):
    events = list(
        client.responses.create(model="m", input="Hi", background=True, stream=True, max_output_tokens=2)
    )
    r = httpx.get(f"{server.url}/v1/responses/{events[0].response.id}?{query}")
    assert r.status_code == status and message in r.json()["error"]["message"]


def test_only_a_streamed_background_response_can_be_followed(server, client):
    polled = client.responses.create(model="m", input="Hi", background=True, max_output_tokens=2)
    _poll(client, polled.id)
    foreground = client.responses.create(model="m", input="Hi", max_output_tokens=2)
    for rid in (polled.id, foreground.id):
        with pytest.raises(openai.BadRequestError, match="was not streamed in the background"):
            list(client.responses.retrieve(rid, stream=True))
    with pytest.raises(openai.NotFoundError):
        list(client.responses.retrieve("resp_nope", stream=True))
    assert client.responses.retrieve(polled.id).status in ("completed", "incomplete")  # without stream


def test_cancelling_a_streamed_background_response_ends_its_followers(server, client):
    stream = client.responses.create(  # (ignore_eos: no sampled end comes before the cancel)
        model="m",
        input="Count to a thousand.",
        background=True,
        stream=True,
        max_output_tokens=3000,
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))
    _poll(client, first.response.id, until=("in_progress",))
    assert client.responses.cancel(first.response.id).status == "cancelled"
    rest = list(stream)  # the stream ends
    assert rest and rest[-1].type != "response.completed"
    server.wait_idle(5)
    deleted_follow = list(client.responses.retrieve(first.response.id, stream=True))
    assert deleted_follow[0].type == "response.created"  # kept while the response is stored
    client.responses.delete(first.response.id)
    with pytest.raises(openai.NotFoundError):
        list(client.responses.retrieve(first.response.id, stream=True))


def test_a_streamed_background_response_that_fails_ends_with_response_failed_and_is_stored_so():
    engine = _failing_engine()
    with RunningServer(engine) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        events = list(client.responses.create(model="m", input="Hi", background=True, stream=True))
        assert events[-1].type == "response.failed"
        failed = _poll(client, events[0].response.id)
        assert failed.status == "failed" and failed.error.message == "the engine failed (boom)"


def test_a_follower_hears_a_keep_alive_while_the_log_is_silent_and_ends_with_it():
    import asyncio

    from engine.api.response_background import EventLog

    async def scenario() -> list:
        log, got = EventLog(), []
        log.add("e0")

        async def follow():
            async for event in log.follow(-1, silence_s=0.05):
                got.append(event)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.12)  # silent: keep-alives
        log.add("e1")
        await asyncio.sleep(0.01)
        log.close()
        await asyncio.wait_for(task, 5)
        return got

    got = asyncio.run(scenario())
    assert got[0] == "e0" and got[-1] == "e1" and None in got[1:-1]
