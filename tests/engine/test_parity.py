"""Greedy continuations and logprobs of ninfer vs transformers on tiny random models, fp32 on CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy_reference, save_tiny, tiny_hf_model

from engine import LLM, SamplingParams

GEN = 32
TIE = 1e-3  # a step whose reference top-2 logprobs are this close is a numerical tie
LOGPROB_ATOL = 1e-4

ARCH_CASES = [
    ("llama", False),
    ("llama", True),
    ("qwen2", False),
    ("qwen3", False),
    ("qwen3", True),
    ("qwen3_5", False),
    ("qwen3_5", True),
]


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (n,), generator=g).tolist()


def _reference(model, ids: list[int]):
    return hf_greedy_reference(model, ids, GEN)


def assert_matches_reference(ours, ref_tokens, ref_logprobs):
    """Tokens equal until a numerical tie (then stop comparing); chosen-token logprobs within tolerance."""
    assert len(ours.token_ids) == GEN
    for step, (tok, ref_tok) in enumerate(zip(ours.token_ids, ref_tokens)):
        ref_lp = ref_logprobs[step]
        top2 = torch.topk(ref_lp, 2).values
        assert abs(ours.logprobs[step][tok] - ref_lp[tok].item()) <= LOGPROB_ATOL, (
            f"logprob differs at step {step}"
        )
        if tok != ref_tok:
            assert (top2[0] - top2[1]).item() < TIE, (
                f"token differs at step {step} without a tie: {tok} vs {ref_tok}"
            )
            return


@pytest.fixture(
    scope="module", params=ARCH_CASES, ids=[f"{a}-{'tied' if t else 'untied'}" for a, t in ARCH_CASES]
)
def model_pair(request, tmp_path_factory):
    arch, tied = request.param
    ref = tiny_hf_model(arch, tied, seed=ARCH_CASES.index((arch, tied)))
    path = save_tiny(ref, tmp_path_factory.mktemp(f"{arch}-{tied}"), max_shard_size="200KB")
    return ref, LLM(path, device="cpu", dtype="float32")


@pytest.mark.parametrize("prompt_len", [1, 17, 150])
def test_greedy_parity(model_pair, prompt_len):
    ref, llm = model_pair
    ids = _prompt(prompt_len, seed=prompt_len)
    ref_tokens, ref_logprobs = _reference(ref, ids)
    assert len(set(ref_tokens)) >= 8, "degenerate fixture: the reference repeats itself"
    params = SamplingParams(max_tokens=GEN, temperature=0.0, logprobs=1, ignore_eos=True)
    ours = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    assert_matches_reference(ours, ref_tokens, ref_logprobs)


def test_chunked_prefill_and_batching_match_single_runs(model_pair, tmp_path):
    """One scheduler code path: a prompt run in 16-token chunks, or batched with others, gives the same tokens."""
    ref, llm = model_pair
    prompts = [_prompt(n, seed=100 + n) for n in (40, 5, 23)]
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0, ignore_eos=True)
    single = [llm.generate(prompt_token_ids=p, sampling_params=params)[0] for p in prompts]
    batched = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in batched] == [o.token_ids for o in single]
    chunked = LLM(llm.engine_config.model, prefill_chunk=16, max_concurrency=2)
    outs = chunked.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in single]
    for a, b in zip(outs, single):
        for lp_a, lp_b in zip(a.logprobs, b.logprobs):
            assert lp_a.keys() == lp_b.keys()
            assert all(abs(lp_a[k] - lp_b[k]) < 1e-4 for k in lp_a)
