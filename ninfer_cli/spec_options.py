"""The speculative-decoding flags shared by serve, chat and bench."""

from __future__ import annotations

from typing import Annotated

import typer

Spec = Annotated[
    str,
    typer.Option(
        help="Speculative decoding: none, or ngram (drafts copied from earlier occurrences of the last tokens; "
        "output unchanged, more tokens per step on repetitive text such as code edits and tool calls)."
    ),
]
DraftTokens = Annotated[int, typer.Option(help="Draft tokens verified per step with --spec.")]
