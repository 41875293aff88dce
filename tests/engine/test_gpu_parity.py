"""On CUDA (skipped elsewhere): the engine through the Triton kernels against transformers on CPU, tiny random
models; fp32 greedy tokens with the tie rule, and bf16 logprobs close to fp32."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy_reference, save_tiny, tiny_hf_model

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

ARCHS = ["llama", "qwen3", "qwen3_5"]
GEN = 24
TIE = 1e-3


def _prompt(n: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    ref = tiny_hf_model(request.param, tied=False, seed=ARCHS.index(request.param))
    return ref, save_tiny(ref, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("prompt_len", [1, 17, 150])
def test_cuda_fp32_greedy_matches_transformers(pair, prompt_len):
    ref, path = pair
    ids = _prompt(prompt_len)
    ref_tokens, ref_lp = hf_greedy_reference(ref, ids, GEN)
    llm = LLM(path, device="cuda", dtype="float32", max_concurrency=2)
    ours = llm.generate(
        prompt_token_ids=ids,
        sampling_params=SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=1),
    )[0]
    for step, (tok, want) in enumerate(zip(ours.token_ids, ref_tokens)):
        assert abs(ours.logprobs[step][tok] - ref_lp[step][tok].item()) < 1e-3
        if tok != want:
            top2 = torch.topk(ref_lp[step], 2).values
            assert (top2[0] - top2[1]).item() < TIE, f"step {step}: {tok} vs {want} without a tie"
            break


def test_cuda_bf16_close_to_fp32(pair):
    _, path = pair
    ids = _prompt(60)
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True, logprobs=0)
    fp32 = LLM(path, device="cuda", dtype="float32").generate(prompt_token_ids=ids, sampling_params=params)[0]
    bf16 = LLM(path, device="cuda", dtype="bfloat16")
    # teacher-forced: the bf16 engine's logprob of each fp32 token
    worst = 0.0
    for k, tok in enumerate(fp32.token_ids[:8]):
        step = SamplingParams(max_tokens=1, temperature=0.0, logprobs=20)
        out = bf16.generate(prompt_token_ids=ids + fp32.token_ids[:k], sampling_params=step)[0]
        worst = max(worst, abs(out.logprobs[0].get(tok, -99.0) - fp32.logprobs[k][tok]))
    assert worst < 0.3
