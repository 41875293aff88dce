"""Turn user-facing errors into one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import sys

import typer

from engine.errors import NinferError


def exits_cleanly(fn):
    """Wrap a command: a NinferError prints `error: <sentence>` and exits 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NinferError as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper
