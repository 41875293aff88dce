"""The penalties that read a request's tokens: repetition / presence / frequency (vLLM's, or over llama.cpp's
repeat_last_n window) and DRY (engine/sample/dry.py). Host-side index lists, one copy to the device."""

from __future__ import annotations

import numpy as np
import torch

from engine.request import SamplingParams, TokenHistory
from engine.sample.dry import dry_penalties
from engine.transfer import to_device


def apply_penalties(logits: torch.Tensor, params: SamplingParams, history: TokenHistory) -> torch.Tensor:
    """The repetition penalty over the tokens seen, presence / frequency penalties over the tokens counted:
    vLLM's (seen: prompt + output; counted: output) or, with repeat_last_n, the last N of both for all."""
    # logits: [V] fp32 (a copy: modified in place)
    if params.repeat_last_n is None:
        output = np.asarray(history.output_ids, dtype=np.int64)
        seen = np.concatenate((history.prompt_unique, output))  # NOTE: repeats are harmless below
    else:
        seen = output = history.tail(params.repeat_last_n)
    if params.repetition_penalty != 1.0 and len(seen):
        ids = to_device(seen, torch.long, logits.device)
        vals = logits[ids]
        logits[ids] = torch.where(
            vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty
        )
    if len(output) and (params.presence_penalty or params.frequency_penalty):
        ids = to_device(output, torch.long, logits.device)
        counts = torch.zeros_like(logits).index_add_(0, ids, torch.ones_like(ids, dtype=logits.dtype))
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def penalize(
    logits: torch.Tensor,  # [R, V] fp32
    params: list[SamplingParams],
    histories: list[TokenHistory | None],
) -> torch.Tensor:
    """A copy of `logits` with each row's penalties and DRY applied (the rows whose params need history)."""
    logits = logits.clone()
    rows, ids, amounts = [], [], []
    for i, p in enumerate(params):
        if not p.needs_history:
            continue
        history = histories[i]
        assert history is not None, "penalties and DRY need the token history"
        if p.has_penalties:
            apply_penalties(logits[i], p, history)
        if p.uses_dry:
            tokens, penalties = dry_penalties(history.tail(p.dry_penalty_last_n), history.dry_breakers, p)
            rows.append(np.full(len(tokens), i, dtype=np.int64))
            ids.append(tokens)
            amounts.append(-penalties)
    if ids and sum(map(len, ids)):
        device = logits.device
        index = (
            to_device(np.concatenate(rows), torch.long, device),
            to_device(np.concatenate(ids), torch.long, device),
        )
        logits.index_put_(index, to_device(np.concatenate(amounts), logits.dtype, device), accumulate=True)
    return logits
