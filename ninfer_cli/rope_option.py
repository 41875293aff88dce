"""The --rope-scaling flag shared by serve, chat, bench and plan."""

from __future__ import annotations

from typing import Annotated

import typer

RopeScaling = Annotated[
    str | None,
    typer.Option(
        help="Stretch the model's positions: yarn:FACTOR[:ORIGINAL_CONTEXT] (Qwen3 to 128K: yarn:4:32768), "
        "none (drop the checkpoint's own scaling), or a JSON object as in config.json's rope_scaling.",
    ),
]
