"""The exponential race (engine/sample/race.py, kernels/race_noise): a key's noise is Exp(1) token by token
and independent across tokens and positions, so a race draws from its distribution; a drafter's race in log
space picks what the sampler's picks; the host's uniform is the kernel's."""

from __future__ import annotations

import math

import pytest
import torch

from engine.request import SamplingParams
from engine.sample.race import NOT_RACED, race_key, race_params, race_pick
from engine.sample.sampler import Sampler
from ninfer_kernels.race_noise.naive import race_noise, race_uniform

P = torch.tensor([0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01])
CHI2_DF9_999 = 27.88  # chi-square, 9 degrees of freedom: exceeded with probability 0.001


def _chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    expected = p.double() * counts.sum()
    return (((counts.double() - expected) ** 2) / expected).sum().item()


def test_the_race_draws_from_its_distribution_position_by_position():
    keys = torch.tensor([race_key(7, position) for position in range(50_000)])
    drawn = (P / race_noise(keys, 10)).argmax(-1)
    assert _chi2(torch.bincount(drawn, minlength=10), P) < CHI2_DF9_999
    # consecutive positions independent: the pairs follow p x p (99 degrees of freedom; 0.001: 148.2)
    pairs = torch.bincount(drawn[:-1] * 10 + drawn[1:], minlength=100)
    assert _chi2(pairs, torch.outer(P, P).flatten()) < 148.2


@pytest.mark.parametrize("seed", [0, -1, 2**64 - 1, 123456789])
def test_keys_are_64_bit_and_the_uniforms_agree_with_the_noise(seed):
    keys = [race_key(seed, position) for position in (0, 1, 180_000)]
    assert len(set(keys)) == 3 and all(-(2**63) <= k < 2**63 for k in keys)
    noise = race_noise(torch.tensor(keys), 300)
    for row, key in enumerate(keys):
        for token in (0, 1, 299):
            assert -math.log(race_uniform(key, token)) == pytest.approx(noise[row, token].item(), rel=1e-6)
    assert race_key(-1, 5) == race_key(2**64 - 1, 5)  # a negative seed is its two's complement


TRUNCATIONS = [
    dict(),
    dict(top_k=20, top_p=0.9),
    dict(top_k=40, min_p=0.05),
    dict(top_p=0.8, min_p=0.02),
    dict(top_k=1),
    dict(top_k=64, top_p=0.95),
]


@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=lambda t: ",".join(t) or "none")
def test_race_pick_is_the_samplers_draw_and_argmax_when_greedy(truncation):
    """A drafter's race (log space, among the candidates when it truncates) and the sampler's (probabilities
    over noise, over the whole vocabulary) pick the same token from the same logits and key; a greedy row
    takes its argmax."""
    torch.manual_seed(0)
    logits = torch.randn(64, 500) * 3
    sampler = Sampler()
    params = [SamplingParams(temperature=0.7, seed=s, **truncation) for s in range(64)]
    drawn = [t.token_id for t in sampler(logits, [f"r{s}" for s in range(64)], params, positions=[9] * 64)]
    keys = torch.tensor([race_key(s, 9) for s in range(64)])
    race = torch.tensor([race_params(p) for p in params])
    assert race_pick(logits, keys, race).tolist() == drawn
    greedy = torch.tensor([NOT_RACED] * 64)
    assert race_pick(logits, keys, greedy).tolist() == logits.argmax(-1).tolist()


def test_the_samplers_race_source():
    """What the sampler gives a drafter: a request's race parameters and keys; greedy and Mirostat
    requests race nothing."""
    sampler = Sampler()
    params = SamplingParams(temperature=0.5, top_k=20, top_p=0.95, min_p=0.01, seed=3)
    assert sampler.draft_race("r", params, 9, 2) == (
        (2.0, 20.0, 0.95, 0.01),
        [race_key(3, 9), race_key(3, 10)],
    )
    assert sampler.draft_race("g", SamplingParams(temperature=0.0), 9, 2) == (NOT_RACED, [0, 0])
    assert sampler.draft_race("m", SamplingParams(temperature=1.0, mirostat=2), 9, 1)[0] == NOT_RACED


def test_an_unseeded_request_keeps_one_random_seed():
    sampler = Sampler()
    params = SamplingParams(temperature=1.0)
    first = sampler.draft_race("a", params, 4, 1)
    assert sampler.draft_race("a", params, 4, 1) == first
    assert sampler.draft_race("b", params, 4, 1) != first  # another request, another seed
    sampler.forget("a")
    assert sampler.num_live_seeds == 1
