"""The sampling distribution of each sampled row: temperature (llama.cpp's dynamic one when asked), then the
truncations, each a mask of logits to -inf run only when some row asks for it: top-n-sigma, top-k and top-p
(one sort), min-p, typical (after min-p, as transformers orders them), XTC (last, as llama.cpp has it); or,
for a Mirostat row, Mirostat's own truncation alone (the others are off for it, as in llama.cpp)."""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.request import SamplingParams
from engine.transfer import to_device

NEG_INF = float("-inf")


MIROSTAT_M = 100  # Mirostat 1 estimates the distribution's Zipf exponent from its top 100 tokens
# a Mirostat row's other samplers, off (its temperature is the plain one)
NEUTRAL = dict(
    dynatemp_range=0.0, top_n_sigma=-1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, xtc_probability=0.0
)


def sampling_probs(
    logits: torch.Tensor,  # [S, V] fp32
    params: list[SamplingParams],
    xtc_rows: torch.Tensor | None,  # [S] bool: the rows whose XTC coin came up this step; None: none did
    mirostat_mu: list[float] | None = None,  # per row: its Mirostat state (rows without Mirostat: any)
) -> torch.Tensor:
    """[S, V] fp32: each row's distribution to draw from."""
    device = logits.device
    vocab = logits.shape[1]
    if mirostat_mu is not None:  # the other truncations are off for Mirostat's rows
        params = [replace(p, **NEUTRAL) if p.mirostat else p for p in params]

    def column(values, dtype=torch.float32) -> torch.Tensor:  # [S, 1]
        return to_device(values, dtype, device).unsqueeze(1)

    temperature = column([p.temperature for p in params])
    if any(p.dynatemp_range > 0 for p in params):
        temperature = dynamic_temperature(
            logits,
            temperature,
            column([max(p.dynatemp_range, 0.0) for p in params]),
            column([p.dynatemp_exponent for p in params]),
        )
    x = logits / temperature
    if any(p.top_n_sigma > 0 for p in params):
        x = top_n_sigma(x, column([max(p.top_n_sigma, 0.0) for p in params]))
    if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
        k = column([p.top_k if 0 < p.top_k < vocab else vocab for p in params], torch.long)
        x = top_k_top_p(x, k, column([p.top_p for p in params]))
    if any(p.min_p > 0.0 for p in params):
        x = min_p(x, column([p.min_p for p in params]))
    if any(p.typical_p < 1.0 for p in params):
        x = typical(x, column([p.typical_p for p in params]))
    if xtc_rows is not None:
        on = xtc_rows.unsqueeze(1) & column([p.xtc_probability > 0 for p in params], torch.bool)
        x = xtc(x, column([p.xtc_threshold for p in params]), on)
    if mirostat_mu is not None:
        modes = [p.mirostat for p in params]
        x = mirostat(x, column(modes, torch.long), column(mirostat_mu), 1 in modes)
    return x.softmax(-1)


def dynamic_temperature(
    logits: torch.Tensor, temperature: torch.Tensor, spread: torch.Tensor, exponent: torch.Tensor
) -> torch.Tensor:
    """[S, 1]: temperature - spread + 2 * spread * (entropy / log(number of tokens left)) ** exponent (at
    least 0: never below 1e-6), for rows with spread > 0; the temperature for the rest."""
    # logits: [S, V]; temperature, spread, exponent: [S, 1]
    logp = logits.log_softmax(-1)
    probs = logp.exp()
    entropy = -torch.where(probs > 0, probs * logp, 0.0).sum(-1, keepdim=True)
    most = logits.isfinite().sum(-1, keepdim=True).clamp(min=2).log()
    lowest = (temperature - spread).clamp(min=0.0)
    dynamic = lowest + (temperature + spread - lowest) * (entropy / most).clamp(0.0, 1.0).pow(exponent)
    return torch.where(spread > 0, dynamic.clamp(min=1e-6), temperature)


def top_n_sigma(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Keep the logits within n standard deviations (of the row's finite logits) of its top one; n 0: all."""
    # x: [S, V]; n: [S, 1]
    finite = x.isfinite()
    count = finite.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, x, 0.0).sum(-1, keepdim=True) / count
    std = (torch.where(finite, x - mean, 0.0).square().sum(-1, keepdim=True) / count).sqrt()
    floor = torch.where(n > 0, x.amax(-1, keepdim=True) - n * std, NEG_INF)
    return x.masked_fill(x < floor, NEG_INF)


def top_k_top_p(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Keep each row's k largest logits (ties at the k-th stay), then of those the nucleus: the most likely
    until their mass reaches p (the top token always stays)."""
    # x: [S, V]; k: [S, 1] int64, V = off; p: [S, 1], 1 = off
    sorted_x, order = x.sort(dim=-1, descending=True)
    sorted_x = sorted_x.masked_fill(sorted_x < sorted_x.gather(1, k - 1), NEG_INF)
    probs = sorted_x.softmax(-1)
    drop = ((probs.cumsum(-1) - probs) >= p) & (p < 1)  # the mass before the token already reaches p
    return torch.empty_like(x).scatter_(1, order, sorted_x.masked_fill(drop, NEG_INF))


def typical(x: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling: keep the tokens whose surprise (-log p) is nearest the row's entropy, in
    that order, until their mass reaches `mass` (at least one token)."""
    # x: [S, V]; mass: [S, 1], 1 = off
    logp = x.log_softmax(-1)
    probs = logp.exp()
    entropy = -torch.where(probs > 0, probs * logp, 0.0).sum(-1, keepdim=True)
    distance = (-logp - entropy).abs()  # +inf for masked tokens: they sort last
    order = distance.argsort(dim=-1)
    sorted_probs = probs.gather(1, order)
    drop = ((sorted_probs.cumsum(-1) - sorted_probs) >= mass) & (mass < 1)  # (a sum may round up to 1)
    return x.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), NEG_INF)


def min_p(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Drop the tokens less likely than p times the row's top probability."""
    # x: [S, V]; p: [S, 1], 0 = off
    probs = x.softmax(-1)
    return x.masked_fill(probs < p * probs.amax(-1, keepdim=True), NEG_INF)


def xtc(x: torch.Tensor, threshold: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """XTC (exclude top choices): where `on`, and two or more tokens are at least `threshold` likely, drop
    all of those but the least likely one."""
    # x: [S, V]; threshold: [S, 1]; on: [S, 1] bool
    probs = x.softmax(-1)
    above = probs >= threshold
    least = torch.where(above, probs, torch.inf).amin(-1, keepdim=True)
    several = above.sum(-1, keepdim=True) >= 2
    return x.masked_fill(above & (probs > least) & several & on, NEG_INF)


def mirostat(x: torch.Tensor, mode: torch.Tensor, mu: torch.Tensor, version_1: bool = True) -> torch.Tensor:
    """Mirostat's truncation at target surprise mu (bits): version 2 keeps the tokens whose surprise
    -log2 p is at most mu; version 1 the top k, k from the Zipf exponent s estimated over the top
    MIROSTAT_M probabilities, k = (e * 2^mu / (1 - V^-e))^(1 / s) with e = s - 1. The top token always
    stays; rows of mode 0 are left as they are. `version_1`: some row is of mode 1 (a host flag)."""
    # x: [S, V]; mode: [S, 1] int64 (0, 1, 2); mu: [S, 1]
    vocab = x.shape[1]
    probs = x.softmax(-1)
    keep = -torch.log2(probs) <= mu  # version 2
    if version_1:
        m = min(MIROSTAT_M, vocab)
        top = probs.topk(m, dim=-1).values  # [S, m], descending
        i = torch.arange(1, m, dtype=x.dtype, device=x.device)
        t = torch.log((i + 1) / i)  # log((i + 2) / (i + 1)) for i = 0 .. m - 2
        pairs = (top[:, :-1] > 0) & (top[:, 1:] > 0)
        b = torch.where(pairs, torch.log(top[:, :-1] / top[:, 1:].clamp(min=1e-38)), 0.0)
        s = (t * b).sum(-1, keepdim=True) / (t * t * pairs).sum(-1, keepdim=True).clamp(min=1e-12)
        e = s - 1
        k = (e * torch.exp2(mu) / (1 - vocab ** (-e))) ** (1 / s)
        k = torch.nan_to_num(k, nan=vocab, posinf=vocab, neginf=1).clamp(1, vocab).long()  # [S, 1]
        kth = probs.sort(dim=-1, descending=True).values.gather(1, k - 1)
        keep = torch.where(mode == 1, probs >= kth, keep)
    keep |= probs >= probs.amax(-1, keepdim=True)
    return x.masked_fill((mode > 0) & ~keep, NEG_INF)
