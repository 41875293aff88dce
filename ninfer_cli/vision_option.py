"""The --vision flag shared by serve, chat and plan."""

from __future__ import annotations

from typing import Annotated

import typer

Vision = Annotated[
    bool,
    typer.Option(
        "--vision",
        help="Load the vision tower (a Qwen3.5 or Qwen3-VL checkpoint with one): messages may carry images "
        "(OpenAI image_url data URLs, Anthropic base64 image blocks).",
    ),
]
Mmproj = Annotated[
    str | None,
    typer.Option(
        "--mmproj",
        metavar="FILE",
        help="A GGUF model's vision tower: llama.cpp's mmproj file published beside it (Qwen3.5, Qwen3-VL); "
        "implies --vision.",
    ),
]
