"""The speculative-decoding flags shared by serve, chat and bench."""

from __future__ import annotations

from typing import Annotated

import typer

Spec = Annotated[
    str,
    typer.Option(
        help="Speculative decoding: none; ngram (drafts copied from earlier occurrences of the last tokens: "
        "code edits, tool calls); mtp (drafts from the model's multi-token-prediction head, Qwen3.5); or draft "
        "(a small model of the same vocabulary, --draft-model). Output unchanged, more tokens per step."
    ),
]
DraftTokens = Annotated[int, typer.Option(help="Draft tokens verified per step with --spec.")]
LmHeadDraft = Annotated[
    bool,
    typer.Option(
        help="With --spec mtp: the head's drafts score only the 32,768 most frequent token ids (a fraction of "
        "the lm_head's bytes per draft); verification uses the whole head, so output is unchanged."
    ),
]

DraftModel = Annotated[
    str | None,
    typer.Option(
        help="With --spec draft: the draft model (HF directory, .gguf or .ninfer) of the model's tokenizer, "
        "e.g. Qwen3-0.6B for a Qwen3-32B; its KV takes pages of the same pool."
    ),
]


def spec_options(spec: str, draft_tokens: int, lm_head_draft: bool, draft_model: str | None = None) -> dict:
    """The LLM options of the speculative-decoding flags."""
    from engine.config import LM_HEAD_DRAFT_TOKENS

    return dict(
        spec=spec,
        draft_tokens=draft_tokens,
        lm_head_draft=LM_HEAD_DRAFT_TOKENS if lm_head_draft else 0,
        draft_model=draft_model,
    )
