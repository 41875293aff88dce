"""Web pages using the server (engine/api/cors.py): this machine's pages and local apps by default, others
with --allowed-origins; preflights need no key; a page from elsewhere is refused in a sentence, in its
route's error shape; requests without an Origin are untouched."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api.cors import LOCAL_ORIGINS, origin_allowed, origin_patterns
from engine.errors import NinferError

KEY = "sk-cors"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def server():
    with RunningServer(ScriptedEngine(["Hello there."] * 50), api_key=KEY) as s:
        yield s


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "http://[::1]:5173",
        "https://localhost",
        "app://obsidian.md",
    ],
)
def test_a_local_page_gets_the_reply_with_cors_headers(server, origin):
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers={**_auth(), "Origin": origin})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == origin and "Origin" in r.headers["vary"]


def test_a_preflight_needs_no_key_and_allows_what_the_page_asks(server):
    r = httpx.options(
        f"{server.url}/v1/messages",
        headers={
            "Origin": "http://localhost:5173",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-api-key, content-type, anthropic-version",
        },
    )
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "x-api-key, content-type, anthropic-version"


def test_a_local_page_without_the_key_can_read_the_401(server):
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:3000"}
    )
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_a_streamed_reply_carries_the_headers(server):
    body = {**CHAT, "stream": True}
    headers = {**_auth(), "Origin": "http://localhost:3000"}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert any("[DONE]" in line for line in r.iter_lines())


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"), ("/api/chat", "ollama")],
)
def test_a_page_from_elsewhere_is_refused_in_its_routes_shape(server, path, shape):
    r = httpx.post(f"{server.url}{path}", json=CHAT, headers={**_auth(), "Origin": "https://evil.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    message = (
        "requests from pages at https://evil.example are not taken; start the server with --allowed-origins "
        "https://evil.example (or * for every origin)"
    )
    body = r.json()
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["message"] == message
    elif shape == "ollama":
        assert body["error"] == message
    else:
        assert body["error"]["message"] == message


def test_a_form_post_from_elsewhere_cannot_drive_the_server(server):
    """A plain form POST needs no preflight: the Origin alone stops it (here one to an open route)."""
    r = httpx.post(
        f"{server.url}/reset_prefix_cache",
        content=b"x=1",
        headers={"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 403
    r = httpx.options(
        f"{server.url}/v1/chat/completions",
        headers={"Origin": "null", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code == 403  # a sandboxed frame's origin is no local page


def test_requests_without_an_origin_are_untouched(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=_auth())
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_allowed_origins_widen_the_default():
    with RunningServer(ScriptedEngine(["Hi."] * 5), allowed_origins=("chrome-extension://*",)) as s:
        ok = httpx.get(f"{s.url}/v1/models", headers={"Origin": "chrome-extension://abcdef"})
        assert (
            ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "chrome-extension://abcdef"
        )
        assert httpx.get(f"{s.url}/v1/models", headers={"Origin": "http://localhost:3000"}).status_code == 403
    with RunningServer(ScriptedEngine(["Hi."] * 5), allowed_origins=("*",)) as s:
        r = httpx.get(f"{s.url}/v1/models", headers={"Origin": "https://anywhere.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://anywhere.example"


def test_origin_patterns():
    assert origin_patterns([]) == LOCAL_ORIGINS
    assert origin_patterns(['["*"]']) == ("*",)  # vLLM's JSON list
    assert origin_patterns(["http://192.168.1.5:3000, chrome-extension://*"]) == (
        "http://192.168.1.5:3000",
        "chrome-extension://*",
    )
    assert origin_allowed("http://localhost:3000", LOCAL_ORIGINS)
    assert not origin_allowed("http://localhost.evil.example", LOCAL_ORIGINS)
    assert not origin_allowed("http://localhost:3000@evil", LOCAL_ORIGINS)
    assert origin_allowed("http://192.168.1.5:3000", ("http://192.168.1.5:3000",))
    assert not origin_allowed("http://192.168.1.5:3001", ("http://192.168.1.5:3000",))
    with pytest.raises(NinferError, match="--allowed-origins 'localhost:3000' is not an origin"):
        origin_patterns(["localhost:3000"])
