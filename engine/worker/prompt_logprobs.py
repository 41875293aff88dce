"""prompt_logprobs: each prompt token's log-probability given the tokens before it, from a step's hidden
states (prompt chunks only: never on the decode hot path)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.request import PromptLogprob
from engine.transfer import to_device

if TYPE_CHECKING:
    from engine.models.base import CausalLM
    from engine.scheduler.output import ScheduledRequest

# rows through lm_head at a time: their fp32 logits and log-softmax, 2 x [ROWS, V], are 127 MB at Qwen3.5's
# 248K vocabulary; they live after the step's forward, in the room its activations had (engine/memory.py)
ROWS = 64


def prompt_logprobs(
    model: CausalLM,
    hidden: torch.Tensor,  # [T, H] final-normed hidden states of the step
    scheduled: list[ScheduledRequest],
    cu_seqlens: list[int],
) -> dict[str, list[PromptLogprob]]:
    """For each request with prompt_logprob_targets: the log-probability and rank of each target given the
    positions before it, with the top-N (its sampling_params.prompt_logprobs) there."""
    out: dict[str, list[PromptLogprob]] = {}
    for i, r in enumerate(scheduled):
        if not r.prompt_logprob_targets:
            continue
        top_n = r.sampling_params.prompt_logprobs
        values: list[PromptLogprob] = []
        for lo in range(0, len(r.prompt_logprob_targets), ROWS):
            targets = r.prompt_logprob_targets[lo : lo + ROWS]
            rows = hidden[cu_seqlens[i] + lo : cu_seqlens[i] + lo + len(targets)]
            logprobs = torch.log_softmax(model.compute_logits(rows), dim=-1)  # [n, V] fp32
            ids = to_device(targets, torch.int64, logprobs.device).unsqueeze(1)
            chosen = logprobs.gather(1, ids)  # [n, 1]
            rank = (logprobs > chosen).sum(-1) + 1  # [n]
            top = torch.topk(logprobs, max(top_n, 1), dim=-1)
            chosen_l, rank_l = chosen.squeeze(1).tolist(), rank.tolist()
            top_ids, top_vals = top.indices[:, :top_n].tolist(), top.values[:, :top_n].tolist()
            for t, lp, rk, alt_ids, alt_vals in zip(targets, chosen_l, rank_l, top_ids, top_vals):
                values.append(PromptLogprob({t: lp, **dict(zip(alt_ids, alt_vals))}, rk))
        out[r.request_id] = values
    return out
