"""`ninfer chat --url` and `ninfer bench --url` against a server still loading its model: they wait out
its 503s (saying so once) and go on when it is ready; past the wait, one line says it is still loading."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

import engine.bench.drivers as drivers
from engine.errors import NinferError
from ninfer_cli.listen import bind
from ninfer_cli.loading import answering_while_loading


def test_a_client_waits_while_the_model_loads(caplog):
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    found: dict = {}
    with answering_while_loading(sock):
        waiting = threading.Thread(target=lambda: found.update(client=drivers.OverHttp(url)), daemon=True)
        with caplog.at_level(logging.WARNING, logger="ninfer"):
            waiting.start()
            time.sleep(1.5)
        assert waiting.is_alive() and "client" not in found
    with RunningServer(ScriptedEngine(["Hi"]), model_id="qwen3-27b", sock=sock):
        waiting.join(timeout=30)
    sock.close()
    assert found["client"].model == "qwen3-27b"
    (told,) = [r.getMessage() for r in caplog.records if "answers 503" in r.getMessage()]
    assert "the model is loading" in told and "waiting until it is ready" in told


def test_a_server_loading_past_the_wait_is_one_line(monkeypatch):
    monkeypatch.setattr(drivers, "READY_WAIT_S", 0)
    sock = bind("127.0.0.1", 0)
    loading = r"still answers 503 after 0 s \(the model is loading"
    with answering_while_loading(sock), pytest.raises(NinferError, match=loading):
        drivers.OverHttp(f"http://127.0.0.1:{sock.getsockname()[1]}", model="m")
    sock.close()


def test_a_page_waiting_for_the_model_can_read_the_503():
    import httpx2 as httpx

    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with answering_while_loading(sock):
        r = httpx.get(f"{url}/health", headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 503 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert httpx.get(f"{url}/health", headers={"Origin": "https://evil.example"}).status_code == 403
    sock.close()
