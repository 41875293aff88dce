"""Quantized KV dtypes end to end: bytes as kv_layout says, logprobs within a stated bound of fp32 KV."""

from __future__ import annotations

import pytest
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.cache.kv_layout import bytes_per_token_per_layer

PROMPT = list(range(10, 70))
# max |logprob(chosen) - logprob_fp32KV(chosen)| over 8 greedy steps, teacher-forced on the fp32 tokens
BOUND = {"bf16": 0.05, "fp16": 0.01, "fp8": 0.3, "int8": 0.05, "k8v4": 0.5}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3", tied=False, head_dim=32), tmp_path_factory.mktemp("kv"))


def _logprobs(llm, tokens):
    """Teacher-forced logprob of each of `tokens` after PROMPT (one request per prefix)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=20)
    outs = llm.generate(
        prompt_token_ids=[PROMPT + tokens[:i] for i in range(len(tokens))], sampling_params=params
    )
    return [o.logprobs[0] for o in outs]


@pytest.mark.parametrize("kv_dtype", list(BOUND))
def test_quantized_kv_logprobs_within_bound(model_dir, kv_dtype):
    ref_llm = LLM(model_dir, kv_dtype="fp32")
    ref = ref_llm.generate(
        prompt_token_ids=PROMPT,
        sampling_params=SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    )[0].token_ids
    ref_lps = _logprobs(ref_llm, ref)
    llm = LLM(model_dir, kv_dtype=kv_dtype)
    lps = _logprobs(llm, ref)
    for tok, a, b in zip(ref, lps, ref_lps):
        if tok in a:
            assert abs(a[tok] - b[tok]) < BOUND[kv_dtype]


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "fp8", "int8", "k8v4", "rk8v4"])
def test_allocated_bytes_match_kv_layout(model_dir, kv_dtype):
    llm = LLM(model_dir, kv_dtype=kv_dtype, kv_capacity=256, block_size=16)
    cfg = llm.model_config
    per_token = bytes_per_token_per_layer(kv_dtype, cfg.num_key_value_heads, cfg.head_dim)
    assert llm.runner.kv_cache_bytes == 256 * cfg.num_full_attention_layers * per_token


def test_kv_layout_arithmetic():
    # 27B full-attention layer: 4 KV heads x 256
    assert bytes_per_token_per_layer("bf16", 4, 256) == 4096
    assert bytes_per_token_per_layer("int8", 4, 256) == 2 * (1024 + 8)
    assert bytes_per_token_per_layer("k8v4", 4, 256) == (1024 + 8) + (512 + 4 * 8 * 2)
    assert bytes_per_token_per_layer("fp8", 4, 256) == 2048


def test_unknown_kv_dtype():
    with pytest.raises(NinferError, match="unknown KV dtype 'int3'"):
        LLM(kv_dtype="int3")


def test_gpu_page_size_must_be_a_power_of_two():
    """The GPU attention kernels read whole pages per key tile; the CPU path takes any page size."""
    with pytest.raises(NinferError, match="block_size must be a power of two on cuda.*got 24"):
        LLM(block_size=24, device="cuda")
