"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds; logprobs of the raw distribution."""

from __future__ import annotations

import torch

from engine.request import SamplingParams
from engine.scheduler.output import SampledToken


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
):
    """Repetition penalty over prompt + output tokens; presence / frequency penalties over output tokens."""
    # logits: [V] fp32 (a copy: modified in place)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long, device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(
            vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty
        )
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids = torch.tensor(output_ids, dtype=torch.long, device=logits.device)
        counts = torch.zeros_like(logits).index_add_(0, ids, torch.ones_like(ids, dtype=logits.dtype))
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    # logits: [V] fp32, already divided by temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop tokens once the mass before them already reaches top_p (the top token always stays)
        drop = (cum - sorted_logits.softmax(-1)) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    def __init__(self):
        self._generators: dict[str, torch.Generator] = {}

    @property
    def num_live_generators(self) -> int:
        return len(self._generators)

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams, device: torch.device) -> torch.Generator:
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=device)
            if params.seed is not None:
                gen.manual_seed(params.seed)
            else:
                gen.seed()
            self._generators[request_id] = gen
        return gen

    def __call__(
        self,
        logits: torch.Tensor,  # [B, V] fp32
        request_ids: list[str],
        params: list[SamplingParams],
        histories: list[tuple[list[int], list[int]] | None] | None = None,
    ) -> list[SampledToken]:
        logprobs = None
        if any(p.logprobs is not None for p in params):
            logprobs = torch.log_softmax(logits, dim=-1)  # NOTE: of the raw model distribution
        token_ids = logits.argmax(dim=-1)  # [B]
        for i, p in enumerate(params):
            row = logits[i]
            if p.has_penalties:
                assert histories is not None and histories[i] is not None, "penalties need the token history"
                row = apply_penalties(row.clone(), p, *histories[i])
                if p.greedy:
                    token_ids[i] = row.argmax()
            if p.greedy:
                continue
            row = _filter(row / p.temperature, p.top_k, p.top_p, p.min_p)
            probs = row.softmax(-1)
            gen = self._generator(request_ids[i], p, logits.device)
            # exponential race: argmax(p / E) with E ~ Exp(1) samples from p
            noise = torch.empty_like(probs).exponential_(generator=gen)
            token_ids[i] = (probs / noise).argmax()
        ids = token_ids.tolist()
        out = []
        for i, p in enumerate(params):
            lp = None
            if p.logprobs is not None:
                row = logprobs[i]
                lp = {ids[i]: row[ids[i]].item()}
                if p.logprobs > 0:
                    top = torch.topk(row, p.logprobs)
                    lp.update(zip(top.indices.tolist(), top.values.tolist()))
            out.append(SampledToken(ids[i], lp))
        return out
