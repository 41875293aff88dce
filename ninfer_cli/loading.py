"""`ninfer serve`'s port while the model loads: it listens at once and answers every request with 503 and
Retry-After (GET /health: `{"status": "loading"}`; other routes: an error in their protocol's shape), so
a health probe or a client's retry loop sees "loading", not a refused connection, as llama-server does.

A small uvicorn server in a thread answers on a duplicate of the listening socket; when the model is up it
stops, and the real server takes the same socket: a connection waiting in the queue at the switch is
answered by the real server, not dropped.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from fastapi.responses import JSONResponse

from engine.api.aliases import canonical
from engine.api.cors import LOCAL_ORIGINS, CorsMiddleware
from engine.api.errors import ApiError, error_for_path
from engine.api.hosts import HostCheckMiddleware

RETRY_AFTER_S = 5  # what a loading 503 asks clients to wait
BACKLOG = 2048  # uvicorn's default


def loading_app(started: float):
    """The ASGI app that answers while the model loads (`started`: time.monotonic() at the start)."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):  # the body is read, so the reply is not cut off by a reset
            pass
        so_far = f"the model is loading ({time.monotonic() - started:.0f} s so far)"
        path = canonical(scope["path"])  # /v1/health is /health (engine/api/aliases.py)
        if path == "/health":
            reply = JSONResponse(
                {"status": "loading", "message": so_far},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        else:
            e = ApiError(503, f"{so_far}; retry in a few seconds", retry_after=RETRY_AFTER_S)
            reply = error_for_path(path, e)
        await reply(scope, receive, send)

    return app


@contextlib.contextmanager
def answering_while_loading(
    sock: socket.socket,
    tls: dict[str, str] | None = None,
    origins: tuple[str, ...] = LOCAL_ORIGINS,
    hosts: tuple[str, ...] | None = None,
) -> Iterator[None]:
    """Listen on `sock` (bound, not yet listening) and answer 503 on it until the block ends; `tls`:
    uvicorn's certificate settings, so an HTTPS server's clients see the 503 over HTTPS too; `origins`:
    --allowed-origins, so a web page waiting for the model can read the 503 as the real server's replies;
    `hosts`: --allowed-hosts' names (None: any), refused as the real server refuses them."""
    import uvicorn

    sock.listen(BACKLOG)
    app = HostCheckMiddleware(CorsMiddleware(loading_app(time.monotonic()), origins), hosts)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", **(tls or {}))
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock.dup()]}, name="ninfer-loading", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        server.should_exit = True
        thread.join()
