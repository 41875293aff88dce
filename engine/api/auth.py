"""The server's front door: each request's path in its canonical spelling (engine/api/aliases.py), then the API
key checked for the routes that need one.

A plain ASGI middleware, not Starlette's `@app.middleware("http")`: that one hands the route a receive
channel on which `Request.is_disconnected()` never sees the client leave, so a non-streamed request whose
client had gone ran to its last token (engine/api/common.py `collect` aborts it at once through this one).
"""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.api.aliases import canonical
from engine.api.errors import ApiError, error_for_path

NO_KEY = "a valid API key is needed (Authorization: Bearer KEY or x-api-key: KEY)"


class AuthMiddleware:
    """`keys`: the API keys (none: every route open); `guarded_paths`: routes outside /v1/ and Ollama's /api/
    that need one too."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], guarded_paths: tuple[str, ...]):
        self.app, self.keys, self.guarded_paths = app, keys, guarded_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope["path"] = canonical(scope["path"])  # another server's spelling (aliases.py)
            path = scope["path"]
            ollama_route = (
                path.startswith("/api/") and path != "/api/version"
            )  # (Ollama's version gate is open)
            guarded = path.startswith("/v1/") or ollama_route or path in self.guarded_paths
            if self.keys and guarded and not authorized(Request(scope), self.keys):
                await error_for_path(path, ApiError(401, NO_KEY))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def authorized(request: Request, keys: tuple[str, ...]) -> bool:
    """The request offers one of `keys` (x-api-key, or Authorization: Bearer), compared in constant time
    against every key, so the time taken says nothing of which key, or how much of one, matched."""
    offered = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if offered is None and auth.lower().startswith("bearer "):
        offered = auth[7:].strip()
    if offered is None:
        return False
    matches = [hmac.compare_digest(offered.encode(), key.encode()) for key in keys]
    return any(matches)
