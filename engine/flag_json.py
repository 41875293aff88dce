"""A flag whose value is a JSON object (--override-generation-config, --chat-template-kwargs)."""

from __future__ import annotations

import json
from typing import Any

from engine.errors import NinferError


def json_object(value: Any, flag: str, example: str) -> dict[str, Any]:
    """`value` (the flag's JSON text, or a dict given in Python) as a dict; else one line naming `flag`
    with `example`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise NinferError(f"{flag} is not JSON ({e}); write e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise NinferError(f"{flag} takes a JSON object, e.g. '{example}'")
    return value
