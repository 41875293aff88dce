"""The speculative-decoding flags shared by serve, chat and bench."""

from __future__ import annotations

from typing import Annotated

import typer

Spec = Annotated[
    str,
    typer.Option(
        help="Speculative decoding: none; ngram (drafts copied from earlier occurrences of the last tokens: "
        "code edits, tool calls); or mtp (drafts from the model's multi-token-prediction head, Qwen3.5). "
        "Output unchanged, more tokens per step."
    ),
]
DraftTokens = Annotated[int, typer.Option(help="Draft tokens verified per step with --spec.")]
