"""Requests from web pages (browser front ends, editor webviews, desktop apps, extensions): cross-origin
resource sharing for the origins `serve --allowed-origins` names, and a refusal for the others.

By default only this machine's pages and the local apps' schemes are taken (localhost, 127.0.0.1, [::1] and
0.0.0.0 on any port; app://, file://, tauri://, vscode-webview://, vscode-file://), as Ollama takes them: a
web site the user happens to visit cannot drive the server (a form's plain POST needs no preflight, so
refusing by Origin is what stops it, not the missing CORS headers alone). Requests without an Origin header
(SDKs, curl, other servers) are never affected. `*` takes every origin (vLLM's and llama-server's default).

A plain ASGI middleware, outermost: a preflight never reaches the API-key check (a browser sends it
without the key), and every answer a page may read (a 401 too) carries the headers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.api.errors import ApiError, error_for_path
from engine.errors import NinferError

LOCAL_ORIGINS = (
    "http://localhost",
    "https://localhost",
    "http://127.0.0.1",
    "https://127.0.0.1",
    "http://[::1]",
    "https://[::1]",
    "http://0.0.0.0",
    "https://0.0.0.0",
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)
METHODS = "GET, POST, PUT, DELETE, HEAD, OPTIONS"
MAX_AGE = "600"  # seconds a browser may keep a preflight's answer


def origin_patterns(values: Iterable[str]) -> tuple[str, ...]:
    """`--allowed-origins` values (repeated, comma-separated, or vLLM's JSON list) as patterns; none: the local
    ones. A pattern is `*`, an origin (`scheme://host`, which takes any port of that host, or with its
    `:port`), a prefix ending in `*` (`chrome-extension://*`), or `null` (the origin sandboxed frames and
    some browsers' local files send; never taken by default, as any site can send it). Refused in a
    sentence when malformed."""
    patterns: list[str] = []
    for value in values:
        text = value.strip()
        if text.startswith("["):  # vLLM's --allowed-origins '["*"]'
            items = re.findall(r'"([^"]*)"', text)
        else:
            items = text.split(",")
        for item in (i.strip() for i in items):
            if item not in ("*", "null") and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^\s/]*\*?", item):
                raise NinferError(
                    f"--allowed-origins {item!r} is not an origin; give scheme://host[:port] (e.g. "
                    "http://192.168.1.5:3000), a prefix ending in * (chrome-extension://*), or * for every origin"
                )
            patterns.append(item)
    return tuple(patterns) or LOCAL_ORIGINS


def origin_allowed(origin: str, patterns: tuple[str, ...]) -> bool:
    """Whether a page at `origin` may use the server."""
    for pattern in patterns:
        if pattern == "*" or origin == pattern:
            return True
        if pattern.endswith("*"):
            if origin.startswith(pattern[:-1]):
                return True
        elif origin.startswith(pattern + ":") and origin[len(pattern) + 1 :].isdigit():
            return True  # the host's pages on any port
    return False


def refusal(origin: str) -> str:
    return (
        f"requests from pages at {origin} are not taken; start the server with --allowed-origins {origin} "
        "(or * for every origin)"
    )


class CorsMiddleware:
    def __init__(self, app: ASGIApp, patterns: tuple[str, ...]):
        self.app, self.patterns = app, patterns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else None
        origin = headers.get("origin") if headers is not None else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not origin_allowed(origin, self.patterns):
            await error_for_path(scope["path"], ApiError(403, refusal(origin)))(scope, receive, send)
            return
        allow = {"access-control-allow-origin": origin, "vary": "Origin"}
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:  # a preflight
            allow.update(
                {
                    "access-control-allow-methods": METHODS,
                    "access-control-allow-headers": headers.get("access-control-request-headers", "*"),
                    "access-control-max-age": MAX_AGE,
                }
            )
            await send({"type": "http.response.start", "status": 204, "headers": _raw(allow)})
            await send({"type": "http.response.body", "body": b""})
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                response_headers["access-control-allow-origin"] = origin
                response_headers.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, with_headers)


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
