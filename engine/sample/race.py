"""The exponential race that draws a sampled token, shared by the sampler and the drafters.

argmax(p / E) over the vocabulary, E ~ Exp(1) a token, is a draw from p. The noise E of a token is a hash of
(row key, token id) (kernels/race_noise), and a row's key is a hash of (request seed, position of the token
it draws), so the noise a request's token at a position meets is known before the step that draws it. The
sampler races the target's distribution; a drafter races its own (the draft's logits penalized as the
sampler penalizes, at the request's temperature, top-k, top-p and min-p) against the same noise at the
position its draft will take. When the two distributions agree the winners agree, so a sampled request's
drafts are accepted about as often as a greedy one's, instead of with the probability the target gives the
drafter's argmax. The drafter leaves out the rest (typical, top-n-sigma, XTC, dynamic temperature, grammar
masks): its draft is a guess, which the target verifies, so the emitted tokens are the target's own draws
either way."""

from __future__ import annotations

import hashlib
import struct

import torch

from engine.request import SamplingParams
from ninfer_kernels import race_noise


def race_key(seed: int, position: int) -> int:
    """The key (signed 64 bits, as an int64 tensor holds it) of the token a request with `seed` draws at
    sequence `position` (a negative seed as its two's complement)."""
    digest = hashlib.blake2b(struct.pack("<QQ", seed % 2**64, position), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


CANDIDATES = 64  # a truncating drafter row races among its draft's 64 most likely tokens
# a drafter row's race parameters, as columns of a [n, 4] fp32 tensor: 1 / temperature (0: greedy), top-k (0:
# off), top-p (1: off), min-p (0: off)
NOT_RACED = (0.0, 0.0, 1.0, 0.0)


def race_params(params: SamplingParams) -> tuple[float, float, float, float]:
    """A request's race parameters (the columns above): its temperature and the truncations a drafter mimics;
    greedy (and Mirostat, whose distribution depends on the state its draws leave) races nothing."""
    if params.greedy or params.mirostat:
        return NOT_RACED
    return (1.0 / params.temperature, float(max(params.top_k, 0)), params.top_p, params.min_p)


def race_pick(
    logits: torch.Tensor,  # [n, V] fp32
    keys: torch.Tensor,  # [n] int64: each row's race key (race_key)
    params: torch.Tensor,  # [n, 4] fp32: each row's race parameters (race_params)
    scale: torch.Tensor | None = None,  # [n, V'] fp32 (V' >= V): the penalties' factor r of each token
    bias: torch.Tensor | None = None,  # [n, V'] fp32: the penalties' subtrahend b of each token
) -> torch.Tensor:
    """[n] int64: each row's winner of the race over its distribution, softmax(logits / temperature)
    truncated as the sampler truncates (top-k, then top-p of what is left, then min-p; among the CANDIDATES
    most likely tokens when a truncation is on), in log space: argmax of log p - log E. A row with 1 /
    temperature 0 takes its argmax. With `scale` and `bias` (penalty_terms) the logits are penalized first,
    as the sampler penalizes them: l / r where l > 0, else l * r, minus b. No host sync (CUDA-graph
    capturable)."""
    if scale is not None:
        width = logits.shape[1]
        r, b = scale[:, :width], bias[:, :width]
        logits = torch.where(logits > 0, logits / r, logits * r) - b
    inv, top_k, top_p, min_p = params.unsqueeze(2).unbind(1)  # [n, 1] each
    log_noise = race_noise(keys, logits.shape[1]).log()  # [n, V]
    x = logits * inv  # [n, V]
    whole = (x - log_noise).argmax(-1)
    c = min(CANDIDATES, logits.shape[1])
    top, ids = x.topk(c, dim=-1)  # [n, c], descending
    counted = (top_k > 0) & (top_k <= c)  # top-k within the candidates (ties at the k-th stay)
    kth = top.gather(1, (top_k.clamp(1, c) - 1).long())
    top = top.masked_fill(counted & (top < kth), float("-inf"))
    # top-p over what top-k left (renormalized), else over the whole row
    norm = torch.where(counted, top.logsumexp(-1, keepdim=True), x.logsumexp(-1, keepdim=True))
    probs = (top - norm).exp()
    top = top.masked_fill((top_p < 1) & (probs.cumsum(-1) - probs >= top_p), float("-inf"))
    top = top.masked_fill((min_p > 0) & (top < top[:, :1] + min_p.log()), float("-inf"))
    among = ids.gather(1, (top - log_noise.gather(1, ids)).argmax(-1, keepdim=True)).squeeze(1)
    truncated = (counted | (top_p < 1) | (min_p > 0)).squeeze(1)
    raced = torch.where(truncated, among, whole)
    return torch.where(inv.squeeze(1) > 0, raced, logits.argmax(-1))
