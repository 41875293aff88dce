"""ninfer's version: the installed distribution's, else (a source tree run with PYTHONPATH=.) pyproject's."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path


@functools.cache
def ninfer_version() -> str:
    try:
        return importlib.metadata.version("ninfer")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        except OSError:
            found = None
        return found.group(1) + "+source" if found else "unknown"
