"""`ninfer serve` as a real subprocess on 127.0.0.1, for tests that talk to it over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import httpx2 as httpx


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_serve(
    *args: str, timeout: float = 120, answers: list[httpx.Response] | None = None, verify: Any = None
) -> tuple[subprocess.Popen, int]:
    """Start `ninfer serve ARGS --port P` and wait until /health answers 200; (process, port). `answers`
    collects the /health replies before that (503s while the model loads). `verify`: an SSL context
    trusting the certificate of a server started with --ssl-certfile, asked over HTTPS."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_cli.main", "serve", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if verify is None:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            else:
                r = httpx.get(f"https://127.0.0.1:{port}/health", timeout=1, verify=verify)
            if r.status_code == 200:
                return proc, port
            if answers is not None:
                answers.append(r)
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.05 if answers is not None else 0.2)
