"""The --int8-prefill flag shared by serve, chat, bench and plan."""

from __future__ import annotations

from typing import Annotated

import typer

Int8Prefill = Annotated[
    bool,
    typer.Option(
        help="Prompt chunks of a quantized model (.ninfer, 4/6/8-bit GGUF) on CUDA multiply int8 activations "
        "(per token and weight group) on the int8 tensor cores; decode keeps 16-bit activations."
    ),
]
