"""Requests naming the server by a host it does not go by (engine/api/hosts.py): refused while it listens on
the loopback only, so a web site pointing its name at 127.0.0.1 (DNS rebinding) cannot read or drive it;
this machine's names, IP addresses and --allowed-hosts names are taken; no check beyond the loopback."""

from __future__ import annotations

import socket

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api.hosts import host_allowed, host_name, host_patterns
from engine.errors import NinferError
from ninfer_cli.listen import bind
from ninfer_cli.loading import answering_while_loading

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
REFUSED = (
    "requests addressed to rebind.example are not taken by a server listening on this machine only (a web "
    "site can point its name here, DNS rebinding); if a proxy forwards that name, start the server with "
    "--allowed-hosts rebind.example"
)


@pytest.fixture(scope="module")
def server():
    hosts = host_patterns("127.0.0.1", ["ninfer.example.com", "*.corp.example"])
    with RunningServer(ScriptedEngine(["Hello there."] * 50), allowed_hosts=hosts) as s:
        yield s


def test_a_rebinding_pages_get_is_refused_in_a_sentence(server):
    r = httpx.get(f"{server.url}/v1/models", headers={"Host": "rebind.example:8000"})
    assert r.status_code == 403
    assert r.json()["error"]["message"] == REFUSED


@pytest.mark.parametrize(
    ("path", "body", "message_of"),
    [
        ("/v1/chat/completions", CHAT, lambda j: j["error"]["message"]),
        ("/v1/messages", {**CHAT, "max_tokens": 4}, lambda j: j["error"]["message"]),
        ("/api/chat", {"model": "m", "messages": CHAT["messages"]}, lambda j: j["error"]),
    ],
)
def test_the_refusal_has_the_routes_error_shape_and_nothing_runs(server, path, body, message_of):
    before = len(server.engine.prompts)
    r = httpx.post(f"{server.url}{path}", json=body, headers={"Host": "rebind.example"})
    assert r.status_code == 403 and message_of(r.json()) == REFUSED
    assert len(server.engine.prompts) == before


@pytest.mark.parametrize(
    "host",
    [
        None,  # the client's own: 127.0.0.1:port
        "localhost:{port}",
        "LOCALHOST.",
        "app.localhost:{port}",
        "printer.local",
        "host.docker.internal:{port}",
        "[::1]:{port}",
        "192.168.1.5:{port}",
        "ninfer.example.com",
        "a.corp.example:443",
        socket.gethostname(),
    ],
)
def test_this_machines_names_addresses_and_allowed_hosts_are_taken(server, host):
    headers = {} if host is None else {"Host": host.format(port=server.port)}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 200, r.text


def test_a_server_checks_no_host_beyond_the_loopback_or_with_a_star():
    assert host_patterns("0.0.0.0", []) is None
    assert host_patterns("192.168.1.5", ["x.example"]) is None
    assert host_patterns("127.0.0.1", ["*"]) is None
    assert host_patterns("localhost", []) is not None and host_patterns("::1", []) is not None
    with RunningServer(ScriptedEngine(["Hi."] * 2)) as s:  # ServerState's default: no check
        assert httpx.get(f"{s.url}/v1/models", headers={"Host": "rebind.example"}).status_code == 200


def test_names_are_matched_whole():
    patterns = host_patterns("127.0.0.1", ["ninfer.example.com", "*.corp.example"])
    assert not host_allowed("evil-ninfer.example.com", patterns)
    assert not host_allowed("corp.example.evil", patterns)
    assert not host_allowed("localhost.evil.example", patterns)
    assert not host_allowed("xlocal", patterns)
    assert host_allowed("deep.a.corp.example", patterns)
    assert [host_name(h) for h in ("[::1]:80", "Example.COM.:8080", "::1", "a.b")] == [
        "::1",
        "example.com",
        "::1",
        "a.b",
    ]


@pytest.mark.parametrize("value", ["http://x.example", "x.example:80", "a b", "*x.example", ""])
def test_a_malformed_allowed_host_is_refused_in_a_sentence(value):
    with pytest.raises(NinferError, match=r"--allowed-hosts .* is not a host name; give a name"):
        host_patterns("127.0.0.1", [value])


def test_the_loading_server_refuses_the_same_hosts():
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with answering_while_loading(sock, hosts=host_patterns("127.0.0.1", [])):
        assert httpx.get(f"{url}/health").status_code == 503
        r = httpx.get(f"{url}/v1/models", headers={"Host": "rebind.example"})
        assert r.status_code == 403 and r.json()["error"]["message"] == REFUSED
    sock.close()
