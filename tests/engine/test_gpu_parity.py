"""On CUDA (skipped elsewhere): the engine through the Triton kernels against transformers on CPU, tiny random
models; fp32 greedy tokens with the tie rule (bf16: test_half_precision.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import hf_greedy_reference, save_tiny, tiny_hf_model

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

ARCHS = ["llama", "qwen3", "qwen3_5", "qwen2"]
GEN = 24
TIE = 1e-3


def _prompt(n: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _assert_greedy_matches(ours, ref_tokens, ref_lp) -> None:
    """The reference's tokens until a numerical tie, chosen-token logprobs within 1e-3."""
    for step, (tok, want) in enumerate(zip(ours.token_ids, ref_tokens)):
        assert abs(ours.logprobs[step][tok] - ref_lp[step][tok].item()) < 1e-3
        if tok != want:
            top2 = torch.topk(ref_lp[step], 2).values
            assert (top2[0] - top2[1]).item() < TIE, f"step {step}: {tok} vs {want} without a tie"
            break


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    ref = tiny_hf_model(request.param, tied=False, seed=ARCHS.index(request.param))
    return ref, save_tiny(ref, tmp_path_factory.mktemp(request.param))


def _assert_cuda_greedy_matches(ref, path, ids: list[int], **options) -> None:
    """The engine on CUDA in fp32 (`options` for LLM) generates transformers' greedy tokens from `ids`."""
    ref_tokens, ref_lp = hf_greedy_reference(ref, ids, GEN)
    llm = LLM(path, device="cuda", dtype="float32", **options)
    ours = llm.generate(
        prompt_token_ids=ids,
        sampling_params=SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=1),
    )[0]
    _assert_greedy_matches(ours, ref_tokens, ref_lp)


@pytest.mark.parametrize("prompt_len", [1, 17, 150])
def test_cuda_fp32_greedy_matches_transformers(pair, prompt_len):
    ref, path = pair
    _assert_cuda_greedy_matches(ref, path, _prompt(prompt_len), max_concurrency=2)


def test_cuda_yarn_matches_transformers_past_the_original_positions(tmp_path):
    """YaRN's scaled table through the Triton rope kernel: a tiny Qwen3 trained on 64 positions, x4."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e6}
    ref = tiny_hf_model("qwen3", tied=False, seed=7, max_position_embeddings=64, rope_parameters=yarn)
    _assert_cuda_greedy_matches(ref, save_tiny(ref, tmp_path), _prompt(150), max_context=256)


def test_cuda_prompt_logprobs_min_tokens_and_twins_match_the_cpu(pair):
    """With CUDA graphs: prompt log-probabilities, min_tokens' banned rows and a choice waiting for its
    twin's prompt give what the CPU engine gives."""
    _, path = pair
    ids = _prompt(70)
    runs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(path, device=device, dtype="float32", max_concurrency=2, prefill_chunk=64)
        scored = SamplingParams(
            max_tokens=6, temperature=0.0, prompt_logprobs=2, min_tokens=4, logit_bias={2: 30}
        )
        first = llm.add_request(ids, scored)
        twin = llm.add_request(
            ids, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), after=first
        )
        outs = {}
        while llm.has_unfinished_requests():
            outs.update({o.request_id: o for o, _ in llm.step() if o.finished})
        runs[device] = outs[first], outs[twin]
    (cpu, cpu_twin), (gpu, gpu_twin) = runs["cpu"], runs["cuda"]
    assert gpu.token_ids == cpu.token_ids and len(gpu.token_ids) >= 4 and 2 not in gpu.token_ids[:4]
    for a, b in zip(gpu.prompt_logprobs[1:], cpu.prompt_logprobs[1:]):
        assert a.logprobs.keys() == b.logprobs.keys()
        assert all(abs(a.logprobs[t] - b.logprobs[t]) < 1e-3 for t in a.logprobs)
    assert gpu_twin.token_ids == cpu_twin.token_ids and gpu_twin.num_cached_tokens == 64


def test_cuda_embeddings_match_the_cpu_beside_decoding_requests(pair):
    """Pooled embeddings on CUDA (graphs on) equal the CPU engine's, also for a prompt whose pages are all
    cached but its last token (pooled in a step it shares with a decoding request)."""
    _, path = pair
    ids = _prompt(40)
    vectors = {}
    for device in ("cpu", "cuda"):
        llm = LLM(path, device=device, dtype="float32", max_concurrency=2)
        first = llm.embed([ids, ids[:17]])
        llm.add_request(_prompt(9), SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
        llm.step()
        again = llm.embed(ids)  # 32 of its 40 tokens come from the prefix cache
        while llm.has_unfinished_requests():
            llm.step()
        vectors[device] = [*first, *again]
    for a, b in zip(vectors["cuda"], vectors["cpu"]):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


def test_cuda_host_cache_brings_an_evicted_prefix_back(pair):
    """--host-cache on CUDA (pinned pages, copies in stream order before the forward, graphs on): a
    prefix evicted by another request's pages comes back and generates what it did when computed."""
    _, path = pair
    a, b = _prompt(50), _prompt(51)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    llm = LLM(
        path,
        device="cuda",
        dtype="float32",
        kv_capacity=64,
        max_context=64,
        max_concurrency=1,
        state_snapshots=8,
        host_cache=1 << 22,
    )
    first = llm.generate(prompt_token_ids=a, sampling_params=params)[0]
    llm.generate(prompt_token_ids=b, sampling_params=params)
    again = llm.generate(prompt_token_ids=a, sampling_params=params)[0]
    assert again.num_cached_tokens == 48 and again.token_ids == first.token_ids
    assert all(abs(x[t] - y[t]) < 1e-4 for x, y, t in zip(again.logprobs, first.logprobs, first.token_ids))


def test_cuda_draft_model_keeps_the_greedy_tokens(pair):
    """spec draft on CUDA (graphs on for the target's verification steps; the draft model eager), the draft
    being the model itself: transformers' greedy tokens."""
    ref, path = pair
    if ref.config.model_type.startswith("qwen3_5"):
        pytest.skip("a hybrid model drafts with spec mtp; a draft model is a plain decoder")
    _assert_cuda_greedy_matches(
        ref, path, _prompt(33), spec="draft", draft_model=str(path), max_concurrency=2
    )


def test_cuda_predictions_beside_plain_requests_keep_the_greedy_tokens(pair):
    """Predicted Outputs on CUDA with graphs, spec ngram, two requests in one step: one with a prediction
    right for its first 8 tokens then wrong, one without (the step's draft counts differ, so the shorter is
    padded to replay a graph): each gets transformers' greedy tokens."""
    ref, path = pair
    prompts = [_prompt(21), _prompt(9)]
    references = [hf_greedy_reference(ref, ids, GEN) for ids in prompts]
    llm = LLM(path, device="cuda", dtype="float32", spec="ngram", draft_tokens=3, max_concurrency=2)
    plain = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=1)
    predicted = dataclasses.replace(plain, prediction=[*references[0][0][:8], 1, 2, 3])
    ids = [llm.add_request(prompts[0], predicted), llm.add_request(prompts[1], plain)]
    outs = {}
    while llm.has_unfinished_requests():
        for out, _ in llm.step():
            outs[out.request_id] = out
    for rid, (ref_tokens, ref_lp) in zip(ids, references):
        _assert_greedy_matches(outs[rid], ref_tokens, ref_lp)
    assert outs[ids[0]].num_prediction_tokens > 0
