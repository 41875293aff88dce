"""Sizes as users write them: 24G, 24GiB, 180k, 184320 (the CLI's flags, and --rope-scaling's original context)."""

from __future__ import annotations

import re

from engine.errors import NinferError

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise NinferError(f"{what} '{text}' is not a size; write e.g. 180k, 131072, 24G or 24GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_bytes(n: int) -> str:
    """A byte count as people read it: 512 B, 3.2 MiB, 17.25 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.{2 if unit == 'GiB' else 1}f} {unit}"
    return f"{n} B"
