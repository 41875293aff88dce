"""--int8-prefill: prompt chunks of a quantized model multiply int8 activations (kernels/int8_act +
kernels/int8_matmul) while decode keeps the 16-bit GEMV; refused with a sentence where there is nothing to
run it on. Through the Triton kernels: compiled on a GPU, interpreted on the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

import ninfer_kernels as kernels
from engine import LLM, SamplingParams
from engine.errors import NinferError
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert
from engine.quant.layer import INT8_MIN_ROWS, packed_weights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = list(range(40, 80))  # 40 tokens: one prompt chunk of 40 rows


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """w4g128 .ninfer files of a tiny Llama and a tiny Qwen3.5 hybrid, and a q4.6 one (mixed widths, fused
    shards of different widths packed apart) of the Llama."""
    root = tmp_path_factory.mktemp("int8_prefill")
    out = {}
    for arch, recipes in (("llama", ("w4g128", "q4.6")), ("qwen3_5", ("w4g128",))):
        src = save_tiny(
            tiny_hf_model(arch, tied=False, seed=5, hidden_size=128, intermediate_size=256), root / arch
        )
        for recipe in recipes:
            out[arch, recipe] = root / f"{arch}-{recipe}.ninfer"
            convert(src, out[arch, recipe], recipe, method="rtn")
    return out


@pytest.mark.parametrize(
    "arch,recipe,kv_dtype",
    [("llama", "w4g128", "auto"), ("llama", "q4.6", "int8"), ("qwen3_5", "w4g128", "int8")],
)
def test_prompt_chunks_take_int8_activations_and_decode_does_not(
    artifacts, monkeypatch, kernel_backend, arch, recipe, kv_dtype
):
    """Over an int8 cache, attention's prompt steps take int8 queries as well (k8v4 needs head_dim 32+;
    the kernel tests cover it)."""
    kernel_backend("triton")
    calls = []  # rows of x of every int8 product
    real = kernels.int8_matmul
    monkeypatch.setattr(kernels, "int8_matmul", lambda codes, *a: calls.append(len(codes)) or real(codes, *a))
    int8_queries = []  # the flag of every attention call
    attend = kernels.paged_attention
    monkeypatch.setattr(kernels, "paged_attention", lambda *a: int8_queries.append(a[-1]) or attend(*a))
    options = dict(device=DEVICE, weight_quant="none", kv_dtype=kv_dtype)
    a16 = LLM(artifacts[arch, recipe], **options)
    a8 = LLM(artifacts[arch, recipe], **options, int8_prefill=True, max_concurrency=INT8_MIN_ROWS + 1)
    weights = packed_weights(a8.model)
    assert weights and all(w.int8_min_rows == INT8_MIN_ROWS for w in weights)
    assert not any(w.int8_min_rows for w in packed_weights(a16.model))
    want, got = sequence_logprobs(a16, PROMPT), sequence_logprobs(a8, PROMPT)
    # every prompt product took the int8 path (the head, run after the forward as for a step's sampled
    # rows, did not)
    assert calls and set(calls) == {len(PROMPT)}
    assert len(calls) == len(packed_weights(a8.model)) - 1  # lm_head
    assert True in int8_queries and False in int8_queries  # the 16-bit run's calls, and the int8 one's
    # int8 activations per (token, group of 128) move the next-token distribution a little: KL 0.006-0.008
    # nats on average, ~150x less than the 4-bit weights themselves move it from the source (~1.2 on these
    # random tiny models)
    kl = (want.exp() * (want - got)).sum(-1)  # [T]
    assert kl.mean() < 2e-2 and kl.max() < 0.1, kl
    # the same top token at most positions (these random models have many near-ties: 35 / 40 here with
    # int8 KV and int8 queries too)
    assert (want.argmax(-1) == got.argmax(-1)).float().mean() >= 0.8
    calls.clear()
    # INT8_MIN_ROWS + 1 requests of 2 tokens at once: after the prompt step(s), a decode step of that
    # many rows, more than INT8_MIN_ROWS
    n = INT8_MIN_ROWS + 1
    prompts = [[7 + i, PROMPT[i]] for i in range(n)]
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    outs = a8.generate(prompt_token_ids=prompts, sampling_params=params)
    assert all(len(o.token_ids) == 2 for o in outs)
    # the prompt chunks went int8 (a hybrid's may be split at state snapshots), the decode steps did not
    # however many rows they had
    assert calls and all(m > n for m in calls), calls
    assert int8_queries[-1] is False  # the last decode step's attention


def test_int8_prefill_is_refused_where_weights_are_not_packed(artifacts, tmp_path, kernel_backend):
    src = save_tiny(tiny_hf_model("llama", tied=True), tmp_path / "hf")
    with pytest.raises(NinferError, match="not quantized .*ninfer convert.*drop --int8-prefill"):
        LLM(src, int8_prefill=True)
    kernel_backend("naive")  # a CPU run dequantizes a .ninfer at load
    with pytest.raises(NinferError, match="dequantized at load .*--device cuda"):
        LLM(artifacts["llama", "w4g128"], int8_prefill=True)


def test_drafts_verify_on_16_bit_activations_as_plain_decoding(artifacts, kernel_backend):
    """With --int8-prefill, 5 requests verify 1 + 3 tokens each (20 rows, past INT8_MIN_ROWS) in 16-bit
    activations, as their plain decode steps run: the same greedy tokens. Drafts: the plain run's own
    continuation, every 3rd one wrong (tests/engine/test_spec_decode.py's scripted proposer)."""
    from test_spec_decode import ScriptedDrafts

    kernel_backend("triton")
    path = artifacts["llama", "w4g128"]
    prompts = [[9 + i, *PROMPT[: 5 + i]] for i in range(5)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    options = dict(device=DEVICE, weight_quant="none", int8_prefill=True, max_concurrency=5)
    plain = LLM(path, **options).generate(prompt_token_ids=prompts, sampling_params=params)
    drafting = LLM(path, spec="ngram", draft_tokens=3, **options)
    full = {f"req-{i}": p + o.token_ids for i, (p, o) in enumerate(zip(prompts, plain))}
    drafting.scheduler.proposer = ScriptedDrafts(full, 3, 3)
    got = drafting.generate(prompt_token_ids=prompts, sampling_params=params)
    assert drafting.scheduler.num_accepted_tokens > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
