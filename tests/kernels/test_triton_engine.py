"""The engine through the Triton kernels (NINFER_KERNELS=triton; on CPU under TRITON_INTERPRET=1) gives the
same greedy tokens as through the naive twins, on the tiny dense models and the tiny hybrid (Qwen3.5: Gated
DeltaNet layers through the conv1d, gated delta rule and gated-norm kernels)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

import ninfer_kernels as kernels
from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_dispatch_follows_device_and_override(kernel_backend):
    x = torch.zeros(1)
    kernel_backend("")
    assert kernels.use_triton(x) is False  # a CPU tensor: the naive twin
    kernel_backend("triton")
    assert kernels.use_triton(x) is True
    kernel_backend("naive")
    assert kernels.use_triton(x) is False
    with pytest.raises(ValueError, match="unknown kernel backend 'cuda'"):
        kernel_backend("cuda")


def test_environment_variable_sets_the_backend_at_start_up():
    probe = "import ninfer_kernels as kernels, torch; print(kernels.use_triton(torch.zeros(1)))"
    for value, expected in (("triton", "True"), ("naive", "False")):
        env = {**os.environ, "NINFER_KERNELS": value}
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expected


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_5"])
def test_greedy_generation_through_triton_equals_naive(tmp_path, monkeypatch, kernel_backend, arch):
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=6), tmp_path)
    prompts = [
        [int(t) for t in torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n))]
        for n in (45, 3)
    ]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
    # 16-token chunks: prefill after a cached prefix, decode rows beside a prefill, and pure decode steps;
    # compiled kernels on a GPU (both backends there), the interpreter on CPU tensors elsewhere
    options = dict(
        prefill_chunk=16, max_concurrency=2, enable_prefix_caching=False, device=DEVICE, dtype="float32"
    )
    kernel_backend("naive")
    naive = LLM(path, **options).generate(prompt_token_ids=prompts, sampling_params=params)
    kernel_backend("triton")
    calls = []
    real = kernels._triton
    monkeypatch.setattr(kernels, "_triton", lambda op: calls.append(op) or real(op))
    triton = LLM(path, **options).generate(prompt_token_ids=prompts, sampling_params=params)
    assert {"rmsnorm", "rope", "silu_mul", "kv_store", "paged_attention"} <= set(calls)
    if arch == "qwen3_5":
        assert {"conv1d", "gated_delta"} <= set(calls)
    for a, b in zip(triton, naive):
        assert a.token_ids == b.token_ids
        for lp_a, lp_b in zip(a.logprobs, b.logprobs):
            assert all(abs(lp_a[t] - lp_b[t]) < 1e-3 for t in lp_b)
