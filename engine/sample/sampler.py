"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds; logprobs of the raw distribution."""

from __future__ import annotations

import torch

from engine.request import SamplingParams
from engine.scheduler.output import SampledToken
from engine.transfer import to_device


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
):
    """Repetition penalty over prompt + output tokens; presence / frequency penalties over output tokens."""
    # logits: [V] fp32 (a copy: modified in place)
    if params.repetition_penalty != 1.0:
        seen = to_device(sorted(set(prompt_ids) | set(output_ids)), torch.long, logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(
            vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty
        )
    if output_ids and (params.presence_penalty or params.frequency_penalty):
        ids = to_device(output_ids, torch.long, logits.device)
        counts = torch.zeros_like(logits).index_add_(0, ids, torch.ones_like(ids, dtype=logits.dtype))
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _filter(
    logits: torch.Tensor,  # [B, V] fp32, already divided by temperature
    top_k: torch.Tensor,  # [B] int64, V = off
    top_p: torch.Tensor,  # [B] fp32, 1 = off
    min_p: torch.Tensor,  # [B] fp32, 0 = off
    use_sort: bool,
    use_min_p: bool,
) -> torch.Tensor:
    """Mask tokens outside top-k, then outside the top-p nucleus, then below min_p x the top probability."""
    if use_sort:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        kth = sorted_logits.gather(1, (top_k - 1).unsqueeze(1))  # [B, 1]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))  # ties at k stay
        probs = sorted_logits.softmax(-1)
        # drop tokens once the mass before them already reaches top_p (the top token always stays)
        drop = (probs.cumsum(-1) - probs) >= top_p.unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    if use_min_p:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p.unsqueeze(1) * probs.amax(-1, keepdim=True), float("-inf"))
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
        """One token per row. All on the device; the only host sync is reading the chosen ids back."""
        num_rows, vocab = logits.shape
        device = logits.device
        raw = logits
        if any(p.has_penalties for p in params):
            logits = logits.clone()
            for i, p in enumerate(params):
                if p.has_penalties:
                    assert histories is not None and histories[i] is not None, (
                        "penalties need the token history"
                    )
                    apply_penalties(logits[i], p, *histories[i])
        token_ids = logits.argmax(dim=-1)  # [B]
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows:
            rows = to_device(sampled_rows, torch.long, device)
            sub = [params[i] for i in sampled_rows]
            temperature = to_device([p.temperature for p in sub], torch.float32, device)
            top_k = to_device([p.top_k if 0 < p.top_k < vocab else vocab for p in sub], torch.long, device)
            top_p = to_device([p.top_p for p in sub], torch.float32, device)
            min_p = to_device([p.min_p for p in sub], torch.float32, device)
            use_sort = any(0 < p.top_k < vocab or p.top_p < 1.0 for p in sub)
            use_min_p = any(p.min_p > 0.0 for p in sub)
            x = _filter(logits[rows] / temperature.unsqueeze(1), top_k, top_p, min_p, use_sort, use_min_p)
            probs = x.softmax(-1)  # [S, V]
            # exponential race: argmax(p / E) with E ~ Exp(1) samples from p; each row draws from its own
            # generator over the whole vocabulary, so a seeded request's draws do not depend on the batch
            noise = torch.empty_like(probs)
            for j, i in enumerate(sampled_rows):
                noise[j].exponential_(generator=self._generator(request_ids[i], params[i], device))
            token_ids = token_ids.index_copy(0, rows, (probs / noise).argmax(dim=-1))
        max_logprobs = max((p.logprobs for p in params if p.logprobs is not None), default=None)
        if max_logprobs is None:
            return [SampledToken(t, None) for t in token_ids.tolist()]
        logprobs = torch.log_softmax(raw, dim=-1)  # NOTE: of the raw model distribution
        chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        top = torch.topk(logprobs, max(max_logprobs, 1), dim=-1)
        ids, chosen, top_ids, top_vals = (
            token_ids.tolist(),
            chosen.tolist(),
            top.indices.tolist(),
            top.values.tolist(),
        )
        out = []
        for i, p in enumerate(params):
            lp = None
            if p.logprobs is not None:
                lp = {ids[i]: chosen[i]}
                lp.update(zip(top_ids[i][: p.logprobs], top_vals[i][: p.logprobs]))
            out.append(SampledToken(ids[i], lp))
        return out
