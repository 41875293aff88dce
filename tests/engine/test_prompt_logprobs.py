"""prompt_logprobs: each prompt token's log-probability given those before it, against transformers' own
forward over the prompt, whatever the chunking, the prefix cache or the batch."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def pair(request, tmp_path_factory):
    ref = tiny_hf_model(request.param, tied=False, seed=3)
    return ref, save_tiny(ref, tmp_path_factory.mktemp(request.param))


def _prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(ref, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # [T, V]: row p predicts token p + 1


def _check(out, ref_lp: torch.Tensor, ids: list[int], top: int) -> None:
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for p, entry in enumerate(out.prompt_logprobs[1:]):
        row, token = ref_lp[p], ids[p + 1]
        assert abs(entry.logprobs[token] - row[token].item()) <= 1e-4, f"position {p + 1}"
        # the rank, up to tokens within the logprob tolerance of this one (numerical near-ties)
        lp = row[token]
        assert int((row > lp + 1e-4).sum()) + 1 <= entry.rank <= int((row > lp - 1e-4).sum()) + 1
        want_top = torch.topk(row, top).indices.tolist() if top else []
        assert set(entry.logprobs) == {token, *want_top}


@pytest.mark.parametrize("prefill_chunk", [2048, 16])
def test_prompt_logprobs_match_transformers(pair, prefill_chunk):
    ref, path = pair
    llm = LLM(path, prefill_chunk=prefill_chunk, max_concurrency=2)
    ids = _prompt(50)
    params = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=2, ignore_eos=True)
    out = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    _check(out, _reference(ref, ids), ids, 2)
    # the same prompt again is in the prefix cache: it is computed whole anyway, and gives the same
    again = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    assert again.num_cached_tokens == 0 and again.prompt_logprobs == out.prompt_logprobs
    assert again.token_ids == out.token_ids
    # without prompt_logprobs the cache is used, and none come back
    plain = llm.generate(prompt_token_ids=ids, sampling_params=SamplingParams(temperature=0.0, max_tokens=3))[
        0
    ]
    assert plain.num_cached_tokens > 0 and plain.prompt_logprobs is None


def test_batched_with_other_requests_and_top_zero(pair):
    ref, path = pair
    llm = LLM(path, prefill_chunk=24, max_concurrency=3)
    prompts = [_prompt(40, 1), _prompt(7, 2), _prompt(30, 3)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=0, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=5, ignore_eos=True),
    ]
    rids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while llm.has_unfinished_requests():
        done.update({o.request_id: o for o, _ in llm.step() if o.finished})
    outs = [done[r] for r in rids]
    _check(outs[0], _reference(ref, prompts[0]), prompts[0], 0)
    assert outs[1].prompt_logprobs is None
    _check(outs[2], _reference(ref, prompts[2]), prompts[2], 5)
    one = llm.generate(prompt_token_ids=[7], sampling_params=params[0])[0]
    assert one.prompt_logprobs == [None]


def test_bad_prompt_logprobs_are_refused():
    with pytest.raises(NinferError, match="prompt_logprobs must be between 0 and 20"):
        SamplingParams(prompt_logprobs=21)


def test_preempted_requests_keep_one_value_per_prompt_token(pair):
    """A KV pool too small for every request at once preempts and recomputes them: their prompt
    log-probabilities come out once each, as an unpressed engine gives them."""
    _, path = pair
    prompts = [_prompt(30 + 7 * i, 50 + i) for i in range(5)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    want = LLM(path, max_concurrency=5).generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(path, max_concurrency=5, kv_capacity=128, prefill_chunk=16)
    preempt, mid_prompt = llm.scheduler._preempt, []

    def preempt_and_note(req):  # some preemptions should land before a prompt's values are all in
        mid_prompt.append(len(req.prompt_logprobs) < req.num_prompt_tokens - 1)
        preempt(req)

    llm.scheduler._preempt = preempt_and_note
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert any(mid_prompt) and not all(mid_prompt)
    for g, w, p in zip(got, want, prompts):
        assert len(g.prompt_logprobs) == len(p) and g.token_ids == w.token_ids
        for a, b in zip(g.prompt_logprobs[1:], w.prompt_logprobs[1:]):
            assert a.logprobs.keys() == b.logprobs.keys() and a.rank == b.rank
            assert all(abs(a.logprobs[t] - b.logprobs[t]) <= 1e-4 for t in a.logprobs)
