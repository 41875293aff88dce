"""A server-log warning said once per process for each key: an input of a kind the server passes over (a
newer block or item type, a tool it does not run) is told the first time, not on every request."""

from __future__ import annotations

import logging
from collections.abc import Hashable

log = logging.getLogger("ninfer")
_said: set[Hashable] = set()


def warn_once(key: Hashable, message: str, *args: object) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)
