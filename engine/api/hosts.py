"""Requests that name the server by a host it does not go by, refused while it listens on the loopback only.

A web site the user visits can point its own name at 127.0.0.1 once the page has loaded (DNS rebinding):
its page's requests then reach this server as same-origin ones, without an Origin header on GETs, so the
CORS check (engine/api/cors.py) does not see them. They still carry the site's name in their Host header.
So while the server listens on the loopback only (`serve --host 127.0.0.1`, the default) a request is taken
only when its Host is an IP address, localhost or a name under .localhost, .local or .internal, or this
machine's host name, as Ollama takes them, or a name `serve --allowed-hosts` adds (a proxy on this machine
that forwards its public name; `*` turns the check off). A server listening on other interfaces is reached
by whatever names the network gives it, and no Host is refused there. Requests without a Host header
(HTTP/1.0) are taken.

A plain ASGI middleware, outermost.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.api.errors import ApiError, error_for_path
from engine.errors import NinferError

LOCAL_NAMES = ("localhost", "*.localhost", "*.local", "*.internal")


def host_patterns(listen_host: str, values: Iterable[str]) -> tuple[str, ...] | None:
    """The Host names a server listening on `listen_host` takes, with `serve --allowed-hosts` values
    (repeated or comma-separated: a name, `*.` and a domain for every name under it, or `*`); None: every
    Host (a server listening beyond the loopback, or `*`). Refused in a sentence when malformed."""
    patterns: list[str] = []
    for value in values:
        for item in (i.strip().lower().rstrip(".") for i in value.split(",")):
            if item != "*" and not re.fullmatch(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*", item):
                raise NinferError(
                    f"--allowed-hosts {item!r} is not a host name; give a name (ninfer.example.com), *. and a "
                    "domain for every name under it (*.example.com), or * to take every name"
                )
            patterns.append(item)
    if "*" in patterns or not listens_on_loopback(listen_host):
        return None
    return (*LOCAL_NAMES, socket.gethostname().lower(), *patterns)


def listens_on_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header, without its port: `[::1]:8000` -> `::1`, `Example.com.:80` -> `example.com`."""
    name = header.strip().lower()
    if name.startswith("["):
        return name[1 : name.find("]")] if "]" in name else name[1:]
    return name.rsplit(":", 1)[0].rstrip(".") if name.count(":") == 1 else name.rstrip(".")


def host_allowed(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a request whose Host names `name` (see `host_name`) is taken."""
    try:
        ipaddress.ip_address(name)
        return True  # an address names no site: a rebinding page always comes by its own name
    except ValueError:
        pass
    for pattern in patterns:
        if name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


def refusal(name: str) -> str:
    return (
        f"requests addressed to {name} are not taken by a server listening on this machine only (a web "
        f"site can point its name here, DNS rebinding); if a proxy forwards that name, start the server "
        f"with --allowed-hosts {name}"
    )


class HostCheckMiddleware:
    def __init__(self, app: ASGIApp, patterns: tuple[str, ...] | None):
        self.app, self.patterns = app, patterns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.patterns is not None and scope["type"] == "http":
            header = Headers(scope=scope).get("host")
            name = host_name(header) if header is not None else None
            if name is not None and not host_allowed(name, self.patterns):
                reply = error_for_path(scope["path"], ApiError(403, refusal(name)))
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)
