"""Start the HTTP server on 127.0.0.1 in a thread, for the API tests."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from engine.api.app import create_app
from engine.api.state import ServerState
from engine.async_llm import AsyncLLM


def qwen_style(engine: AsyncLLM) -> AsyncLLM:
    """The engine with a Qwen-style chat template (tools, tool calls, think tags) over its tokenizer."""
    from dataclasses import replace

    from scripted_engine import QWEN_STYLE_TEMPLATE

    engine.tokenizer = replace(engine.tokenizer, chat_template=QWEN_STYLE_TEMPLATE)
    return engine


def templated_prompt(template: str, messages: list[dict]) -> tuple[int, str]:
    """A chat completion of `messages` on a scripted engine whose chat template is `template`: (the
    status, the prompt the engine was given, else the reply's body)."""
    from dataclasses import replace

    import httpx2 as httpx
    from scripted_engine import ScriptedEngine

    engine = ScriptedEngine(["ok"])
    engine.tokenizer = replace(engine.tokenizer, chat_template=template)
    with RunningServer(engine) as server:
        body = {"model": "m", "messages": messages, "max_tokens": 4}
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    return reply.status_code, engine.prompts[0] if engine.prompts else reply.text


class RunningServer:
    def __init__(
        self,
        engine: AsyncLLM,
        model_id: str = "smollm2",
        api_key: str | None = None,
        sock: socket.socket | None = None,
        allowed_origins: tuple[str, ...] | None = None,
        allowed_hosts: tuple[str, ...] | None = None,
    ):
        """`sock`: a bound socket to serve on (as `ninfer serve` does); else a free port of its own.
        `allowed_origins`: serve --allowed-origins' patterns (None: the default, local pages);
        `allowed_hosts`: the Host names taken (engine/api/hosts.py; None: any, the default)."""
        self.engine = engine
        self.state = ServerState(engine, model_id, (api_key,) if api_key else ())
        if allowed_origins is not None:
            self.state.allowed_origins = allowed_origins
        self.state.allowed_hosts = allowed_hosts
        if sock is None:
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
            probe.close()
        else:
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(self.state), host="127.0.0.1", port=self.port, log_level="warning")
        )
        sockets = {"sockets": [sock]} if sock is not None else {}
        self.thread = threading.Thread(target=self.server.run, kwargs=sockets, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def wait_idle(self, seconds: float = 10.0) -> dict:
        """The engine's stats once nothing runs or waits (a stream a client left is aborted by the engine's
        loop a moment later); fails if requests are still there after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            stats = self.engine.stats()
            if stats["num_running"] == 0 and stats["num_waiting"] == 0:
                return stats
            assert time.monotonic() < deadline, f"requests left running: {stats}"
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()
