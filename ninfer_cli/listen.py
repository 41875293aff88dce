"""`ninfer serve`'s listening socket, bound before the model loads: a port in use, one that needs
privileges or a host that is not this machine's is said at once, not after minutes of loading weights."""

from __future__ import annotations

import errno
import socket

from engine.errors import NinferError


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), not yet listening (uvicorn listens once the engine is up)."""
    if not 0 <= port <= 65535:
        raise NinferError(f"--port {port} is not a port; use 1-65535 (8000 by default)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise _foreign_host(host, f" ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise NinferError(
                f"port {port} on {host} is in use (another server?); stop it, or pick another --port"
            ) from None
        if e.errno == errno.EACCES:
            raise NinferError(f"port {port} needs privileges to listen on; use a port above 1023") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise _foreign_host(host) from None
        raise NinferError(f"cannot listen on {host}:{port} ({e.strerror})") from None
    sock.set_inheritable(True)
    return sock


def _foreign_host(host: str, why: str = "") -> NinferError:
    return NinferError(
        f"--host {host} is not an address of this machine{why}; use 127.0.0.1 (this machine only) or 0.0.0.0 "
        "(every interface)"
    )
