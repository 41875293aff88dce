"""`ninfer serve`'s port while the model loads: 503 with Retry-After in each protocol's shape, then the
real server takes the same socket, answering a connection that queued at the switch."""

from __future__ import annotations

import socket
import threading

import anthropic
import httpx2 as httpx
import openai
import pytest
import uvicorn

from ninfer_cli.listen import bind
from ninfer_cli.loading import answering_while_loading


async def _ready(scope, receive, send):
    if scope["type"] == "http":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"ready"})


def test_loading_answers_503_then_the_server_takes_the_socket():
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with answering_while_loading(sock):
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503 and health.headers["retry-after"] == "5"
        assert health.json()["status"] == "loading" and "the model is loading" in health.json()["message"]
        assert httpx.get(f"{url}/v1/health", timeout=10).json()["status"] == "loading"  # llama-server's path
        gpt = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="the model is loading") as e:
            gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503 and e.value.body["type"] == "server_error"
        claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.InternalServerError, match="retry in a few seconds") as e:
            claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503 and e.value.body["error"]["type"] == "api_error"
        big = httpx.post(f"{url}/v1/completions", content=b"x" * 3_000_000, timeout=10)  # read, not reset
        assert big.status_code == 503
    queued = socket.create_connection(sock.getsockname(), timeout=10)  # nobody accepts it yet
    server = uvicorn.Server(uvicorn.Config(_ready, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        queued.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := queued.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and b"\r\nready\r\n" in reply
    finally:
        queued.close()
        server.should_exit = True
        thread.join()
        sock.close()
