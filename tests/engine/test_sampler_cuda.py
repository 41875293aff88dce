"""The sampler on CUDA tensors (gpu-marked: skipped without a device): penalties, DRY and every truncation
(Mirostat's too) give the CPU's distribution, and run without a host sync (torch's sync debug mode set to
error around them); a whole sampler call with all of them reads back once."""

from __future__ import annotations

import pytest
import torch

from engine.request import Request, SamplingParams
from engine.sample.filters import sampling_probs
from engine.sample.penalties import penalize
from engine.sample.sampler import Sampler

pytestmark = pytest.mark.gpu

PARAMS = [
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.1),
    SamplingParams(temperature=1.0, typical_p=0.9, top_n_sigma=1.5, dynatemp_range=0.3, repeat_last_n=64),
    SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.05, dry_multiplier=0.8),
    SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=4.0, presence_penalty=0.5),
    SamplingParams(temperature=0.7, mirostat=1, frequency_penalty=0.3, dry_multiplier=1.0, dry_base=2.0),
]


def _histories(vocab: int):
    gen = torch.Generator().manual_seed(0)
    out = []
    for p in PARAMS:
        prompt = torch.randint(0, 64, (300,), generator=gen).tolist()
        req = Request("r", prompt, p, dry_breakers=None)
        req.output_token_ids = torch.randint(0, 64, (40,), generator=gen).tolist()
        out.append(req.token_history())
    return out


def test_penalties_and_truncations_match_the_cpu_without_a_sync():
    torch.manual_seed(1)
    vocab = 4096
    logits = torch.randn(len(PARAMS), vocab) * 3
    histories = _histories(vocab)
    xtc = torch.tensor([False, False, True, False, False])
    mus = [0.0, 0.0, 0.0, 8.0, 9.0]
    want = sampling_probs(penalize(logits, PARAMS, histories), PARAMS, xtc, mus)
    gpu, xtc_gpu = logits.cuda(), xtc.cuda()  # (the test's own copies: a pageable copy synchronizes)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = sampling_probs(penalize(gpu, PARAMS, histories), PARAMS, xtc_gpu, mus)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-3)


def test_a_sampler_call_with_all_of_them_on_cuda():
    sampler = Sampler()
    torch.manual_seed(2)
    logits = (torch.randn(len(PARAMS), 4096) * 3).cuda()
    ids = [f"r{i}" for i in range(len(PARAMS))]
    for position in range(3):
        out = sampler(logits, ids, PARAMS, _histories(4096), positions=[position] * len(PARAMS))
        assert len(out) == len(PARAMS) and all(0 <= t.token_id < 4096 for t in out)
    assert set(sampler._mirostat_mu) == {"r3", "r4"}
