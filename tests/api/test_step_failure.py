"""A request whose engine step fails gets each protocol's server error in a sentence (500, or the error event
of a stream that began); so does a stream the server's own code fails in; the server goes on answering."""

from __future__ import annotations

import json

import anthropic
import httpx2 as httpx
import openai
import pytest
from server import RunningServer, qwen_style

from engine.async_llm import AsyncLLM

MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def server():
    with RunningServer(qwen_style(AsyncLLM(max_concurrency=2))) as s:
        yield s


@pytest.fixture
def fail_next_step(server, monkeypatch):
    """The next step that runs tokens raises (once)."""
    runner = server.engine.llm.runner
    real, failed = runner.execute, []

    def execute(sched):
        if sched.scheduled and not failed:
            failed.append(1)
            raise RuntimeError("boom in the step")
        return real(sched)

    monkeypatch.setattr(runner, "execute", execute)
    return failed


def _works_after(server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    server.wait_idle()


def _sse_events(server, path: str, body: dict) -> list:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200  # the stream began before the failure
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]


def test_openai_chat_gets_a_500_in_a_sentence(server, fail_next_step):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="the engine failed while running this request"):
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5)
    assert fail_next_step
    _works_after(server)


def test_anthropic_messages_get_an_api_error(server, fail_next_step):
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as caught:
        claude.messages.create(model="m", messages=MESSAGES, max_tokens=5)
    assert caught.value.body["error"]["type"] == "api_error"
    assert "boom in the step" in caught.value.body["error"]["message"]
    _works_after(server)


def test_an_openai_stream_ends_with_an_error_event(server, fail_next_step):
    events = _sse_events(
        server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5, "stream": True}
    )
    assert events[-1]["error"]["type"] == "server_error"
    assert "the engine failed while running this request" in events[-1]["error"]["message"]
    _works_after(server)


def test_an_anthropic_stream_ends_with_an_api_error_event(server, fail_next_step):
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 5, "stream": True}
    events = _sse_events(server, "/v1/messages", body)
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "api_error"
    assert "boom in the step" in events[-1]["error"]["message"]
    _works_after(server)


def test_a_failed_request_is_counted_by_its_reason(server, fail_next_step):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model="m", prompt="Hello", max_tokens=5)
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'ninfer_requests_finished_total{reason="error"}' in metrics
    _works_after(server)


@pytest.fixture
def broken_stream(server, monkeypatch):
    """A bug in the server's own streaming code: counting a streamed token raises."""

    def token(out):
        raise RuntimeError("boom while streaming")

    monkeypatch.setattr(server.state.metrics, "token", token)


def _lines(server, path: str, body: dict) -> list[str]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


STREAMS = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
    "completions": ("/v1/completions", {"prompt": "Hello"}),
    "llama.cpp": ("/completion", {"prompt": "Hello"}),
    "anthropic": ("/v1/messages", {"model": "m", "messages": MESSAGES}),
    "responses": ("/v1/responses", {"input": "Say hi"}),
    "ollama": ("/api/chat", {"model": "m", "messages": MESSAGES}),
}


@pytest.mark.parametrize("route", list(STREAMS))
def test_a_bug_while_streaming_ends_the_stream_with_an_error_event(server, broken_stream, route):
    path, body = STREAMS[route]
    limit = {"num_predict": 8} if route == "ollama" else {"max_tokens": 8}
    if route == "llama.cpp":
        limit = {"n_predict": 8}
    elif route == "responses":
        limit = {"max_output_tokens": 8}
    lines = _lines(server, path, {**body, **limit, "stream": True})
    last = json.loads(lines[-1].removeprefix("data: "))
    message = "internal error (RuntimeError) while streaming the reply; see the server log"
    if route == "anthropic":
        assert last["type"] == "error" and last["error"] == {"type": "api_error", "message": message}
    elif route == "responses":
        assert last["type"] == "error" and last["message"] == message and last["code"] == "server_error"
    elif route == "ollama":
        assert last == {"error": message}
    else:
        assert last["error"]["message"] == message
    server.wait_idle()  # the request was aborted: nothing runs on


def test_a_bug_while_streaming_in_the_background_is_said_and_stored_as_failed(server, broken_stream):
    lines = _lines(
        server,
        "/v1/responses",
        {"input": "Say hi", "max_output_tokens": 8, "background": True, "stream": True},
    )
    message = "internal error (RuntimeError) while streaming the reply; see the server log"
    last = json.loads(lines[-1].removeprefix("data: "))
    assert last["type"] == "error" and last["message"] == message
    rid = json.loads(lines[1].removeprefix("data: "))["response"]["id"]
    stored = httpx.get(f"{server.url}/v1/responses/{rid}").json()
    assert stored["status"] == "failed" and stored["error"]["message"] == message
    server.wait_idle()


def test_health_says_so_while_every_step_fails_and_recovers_after(server, monkeypatch):
    runner = server.engine.llm.runner
    real = runner.execute

    def execute(sched):
        if sched.scheduled:
            raise RuntimeError("boom in every step")
        return real(sched)

    monkeypatch.setattr(runner, "execute", execute)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    for _ in range(3):
        assert (
            httpx.get(f"{server.url}/health").status_code == 200
        )  # a failure or two is not a failing engine
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5)
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 503 and health.json() == {
        "status": "error",
        "message": "the last 3 engine steps failed (RuntimeError: boom in every step), so requests end with "
        "an error until one runs; the server log has the details",
    }
    assert httpx.get(f"{server.url}/ping").status_code == 503
    monkeypatch.setattr(runner, "execute", real)
    _works_after(server)  # one step that runs: healthy again
    assert httpx.get(f"{server.url}/ping").status_code == 200
