"""Prompt log-probabilities over the OpenAI routes: vLLM's `prompt_logprobs` field (chat and text
completions) and the legacy completions' `echo` with `logprobs` (the prompt's tokens first, the first with
null), which lm-evaluation-harness scores multiple-choice tasks with."""

from __future__ import annotations

from typing import Any

from engine.api.common import field, top_alternatives
from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.api.token_names import TokenNames
from engine.request import RequestOutput


def prompt_logprobs_field(body: dict) -> int | None:
    """vLLM's `prompt_logprobs` (the top-N alternatives at each prompt token), refused when streamed."""
    top = field(body, "prompt_logprobs", int)
    if top is not None and field(body, "stream", bool, False):
        raise ApiError(400, "'prompt_logprobs' are not available with 'stream': true", "prompt_logprobs")
    return top


def vllm_prompt_logprobs(state: ServerState, out: RequestOutput, top: int) -> list[dict[str, Any] | None]:
    """vLLM's form: per prompt token (null for the first), {token id: {logprob, rank, decoded_token}} for
    the token and the top-N there."""
    decode = state.engine.tokenizer.decode
    items: list[dict[str, Any] | None] = [None]
    for token, entry in zip(out.prompt_token_ids[1:], (out.prompt_logprobs or [None])[1:]):
        ranked = top_alternatives(entry.logprobs, top)
        ranks = {t: k + 1 for k, (t, _) in enumerate(ranked)}
        ranks[token] = entry.rank
        items.append(
            {
                str(t): {
                    "logprob": v,
                    "rank": ranks[t],
                    "decoded_token": decode([t], skip_special_tokens=False),
                }
                for t, v in [(token, entry.logprobs[token]), *ranked]
            }
        )
    return items


def legacy_prompt_logprobs(names: TokenNames, out: RequestOutput, top: int) -> dict[str, list]:
    """The legacy completions' logprobs of the echoed prompt: tokens, token_logprobs, top_logprobs and
    text_offset, null for the first token."""
    tokens, logprobs, top_logprobs, text_offset = [], [], [], []
    offset = 0
    for token, entry in zip(out.prompt_token_ids, out.prompt_logprobs or []):
        piece = names.piece(token)
        tokens.append(names.name(token, piece))
        text_offset.append(offset)
        offset += len(piece)
        if entry is None:
            logprobs.append(None)
            top_logprobs.append(None)
            continue
        logprobs.append(entry.logprobs[token])
        ranked = top_alternatives(entry.logprobs, top)
        top_logprobs.append({names.name(t): v for t, v in ranked})
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }
