"""--int8-prefill: prompt chunks of a quantized model multiply int8 activations (kernels/int8_act +
kernels/int8_matmul) while decode keeps the 16-bit GEMV; refused with a sentence where there is nothing to
run it on. Through the Triton kernels: compiled on a GPU, interpreted on the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

import kernels
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


@pytest.mark.parametrize("arch,recipe", [("llama", "w4g128"), ("llama", "q4.6"), ("qwen3_5", "w4g128")])
def test_prompt_chunks_take_int8_activations_and_decode_does_not(
    artifacts, monkeypatch, kernel_backend, arch, recipe
):
    kernel_backend("triton")
    calls = []  # rows of x of every int8 product
    real = kernels.int8_matmul
    monkeypatch.setattr(kernels, "int8_matmul", lambda codes, *a: calls.append(len(codes)) or real(codes, *a))
    a16 = LLM(artifacts[arch, recipe], device=DEVICE, weight_quant="none")
    a8 = LLM(artifacts[arch, recipe], device=DEVICE, weight_quant="none", int8_prefill=True)
    weights = packed_weights(a8.model)
    assert weights and all(w.int8_min_rows == INT8_MIN_ROWS for w in weights)
    assert not any(w.int8_min_rows for w in packed_weights(a16.model))
    want, got = sequence_logprobs(a16, PROMPT), sequence_logprobs(a8, PROMPT)
    # every prompt product took the int8 path (the head too: all 40 positions are scored here)
    assert calls and set(calls) == {len(PROMPT)}
    # int8 activations per (token, group of 128) move the next-token distribution a little: KL 0.006-0.008
    # nats on average, ~150x less than the 4-bit weights themselves move it from the source (~1.2 on these
    # random tiny models)
    kl = (want.exp() * (want - got)).sum(-1)  # [T]
    assert kl.mean() < 2e-2 and kl.max() < 0.1, kl
    assert (want.argmax(-1) == got.argmax(-1)).float().mean() >= 0.9
    calls.clear()
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    out = a8.generate(prompt_token_ids=PROMPT, sampling_params=params)[0]
    assert len(out.token_ids) == 5
    # the prompt's chunks went int8 (a hybrid's may be split at a state snapshot: chunks of under
    # INT8_MIN_ROWS rows and the head's last-position row take the GEMV), the one-row decode steps did not
    assert calls and all(INT8_MIN_ROWS <= m <= len(PROMPT) for m in calls)


def test_int8_prefill_is_refused_where_weights_are_not_packed(artifacts, tmp_path, kernel_backend):
    src = save_tiny(tiny_hf_model("llama", tied=True), tmp_path / "hf")
    with pytest.raises(NinferError, match="not quantized .*ninfer convert.*drop --int8-prefill"):
        LLM(src, int8_prefill=True)
    kernel_backend("naive")  # a CPU run dequantizes a .ninfer at load
    with pytest.raises(NinferError, match="dequantized at load .*--device cuda"):
        LLM(artifacts["llama", "w4g128"], int8_prefill=True)
