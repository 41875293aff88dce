"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds; logprobs of the raw distribution."""

from __future__ import annotations

import torch

from engine.request import SamplingParams
from engine.scheduler.output import SampledToken


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
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
    return logits


class Sampler:
    def __init__(self):
        self._generators: dict[str, torch.Generator] = {}

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
    ) -> list[SampledToken]:
        greedy = logits.argmax(dim=-1)  # [B]
        logprobs = None
        if any(p.logprobs is not None for p in params):
            logprobs = torch.log_softmax(logits, dim=-1)
        token_ids = greedy.clone()
        for i, p in enumerate(params):
            if p.greedy:
                continue
            row = _filter_top_k_top_p(logits[i] / p.temperature, p.top_k, p.top_p)
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
