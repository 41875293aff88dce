"""Where ninfer keeps its files: $NINFER_HOME, else ~/.cache/ninfer (fetched models, the chat history; the
native CPU kernels' builds use the same folder, kernels/native_build.cache_dir)."""

from __future__ import annotations

import os
from pathlib import Path


def ninfer_home() -> Path:
    return Path(os.environ.get("NINFER_HOME", Path.home() / ".cache" / "ninfer"))
