"""--cache-reuse: keys rotated to new positions equal keys stored there (every KV dtype); a prompt with
tokens dropped from an earlier one takes the rest from that one's pages and answers as a cold run; what it
does not apply to is refused or left alone; nothing leaks."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_COMMON, save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.cache.kv_layout import KV_DTYPES, KVCache
from engine.cache.kv_shift import shift_kv
from engine.errors import NinferError
from ninfer_kernels.kv_quant.naive import read_kv
from ninfer_kernels.kv_store.naive import kv_store

# relative RMS error of the shifted keys against keys stored at the new positions: the rotation's float
# error, or one more rounding of the quantized dtypes
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3, "fp8": 8e-2, "int8": 1.5e-2, "k8v4": 1.5e-2}


def _rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    half = inv_freq.numel()
    angle = positions[:, None].float() * inv_freq[None, :]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half :]], dim=-1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("rotary_dim", [64, 32])  # all of the head, or part of it
def test_shifted_keys_equal_keys_stored_at_the_new_positions(kv_dtype, rotary_dim, device):
    torch.manual_seed(0)
    n, hk, d, bs = 37, 2, 64, 16
    inv_freq = (1.0 / (1e6 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))).to(device)
    k, v = torch.randn(n, hk, d, device=device), torch.randn(n, hk, d, device=device)
    old = torch.arange(100, 100 + n, device=device)
    new = torch.arange(40, 40 + n, device=device)  # 60 positions earlier: tokens before them were dropped
    cache = KVCache.allocate(kv_dtype, 16, bs, hk, d, device)
    want = KVCache.allocate(kv_dtype, 16, bs, hk, d, device)
    src = torch.arange(n, device=device) + 3 * bs + 5  # crossing pages
    dst = torch.arange(n, device=device) + 9 * bs + 11
    kv_store(_rope(k, old, inv_freq), v, cache, src)
    kv_store(_rope(k, new, inv_freq), v, want, dst)
    shift_kv([cache], src, dst, (new - old).float(), inv_freq)
    blocks = torch.arange(16, device=device)
    (got_k, got_v), (want_k, want_v) = read_kv(cache, blocks), read_kv(want, blocks)
    err = (got_k[dst] - want_k[dst]).pow(2).mean().sqrt() / want_k[dst].pow(2).mean().sqrt()
    assert err <= TOLERANCE[kv_dtype], err
    assert torch.equal(got_v[dst], want_v[dst])  # values copied as stored
    assert torch.equal(got_k[src], read_kv(cache, blocks)[0][src])  # the sources are left as they were


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3", tied=False, seed=3, head_dim=32), tmp_path_factory.mktemp("q3"))


@pytest.fixture(scope="module")
def one_layer_dir(tmp_path_factory):
    """One decoder layer: its keys and values depend on each token and its position alone, so K/V taken from
    a sequence with other tokens before them are exactly a cold run's (deeper layers' carry what the
    dropped tokens contributed: llama-server's approximation)."""
    import transformers as tf

    torch.manual_seed(3)
    config = tf.Qwen3Config(num_hidden_layers=1, rope_theta=1e6, tie_word_embeddings=False, **TINY_COMMON)
    return save_tiny(tf.Qwen3ForCausalLM(config), tmp_path_factory.mktemp("q3one"))


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)


def _run(llm: LLM, prompt: list[int]):
    return llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY)[0]


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
def test_a_window_that_slid_takes_the_rest_from_the_earlier_pages(one_layer_dir, kv_dtype):
    """A = head + dropped + kept; B = head + kept + new: B's cached prefix is head's pages, then `kept`
    comes from A's pages at 40 positions earlier; its reply is the cold run's."""
    head, dropped, kept, new = _tokens(48, 1), _tokens(40, 2), _tokens(70, 3), _tokens(9, 4)
    dense_dir = one_layer_dir
    llm = LLM(dense_dir, kv_dtype=kv_dtype, cache_reuse=16)
    free = llm.scheduler.block_pool.num_free_blocks
    _run(llm, head + dropped + kept)
    out = _run(llm, head + kept + new)
    # A's named pages: 158 tokens and 5 of its reply, 10 full pages: all of `kept` is there
    assert out.num_cached_tokens == 48 + 70
    cold = _run(LLM(dense_dir, kv_dtype=kv_dtype), head + kept + new)
    assert out.token_ids == cold.token_ids
    for token, got, want in zip(out.token_ids, out.logprobs, cold.logprobs, strict=True):
        assert abs(got[token] - want[token]) < (1e-4 if kv_dtype == "fp32" else 5e-2)
    llm.step()  # an idle step lets the held source pages go
    assert llm.scheduler.block_pool.num_free_blocks == free and not any(llm.scheduler.block_pool.ref_cnt)
    plain = LLM(dense_dir, kv_dtype=kv_dtype)
    _run(plain, head + dropped + kept)
    assert _run(plain, head + kept + new).num_cached_tokens == 48  # without the flag: the shared pages only


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_on_cuda_with_graphs_a_window_that_slid_answers_as_a_cold_run(one_layer_dir, kv_dtype):
    head, dropped, kept, new = _tokens(48, 1), _tokens(40, 2), _tokens(70, 3), _tokens(9, 4)
    on_cuda = dict(device="cuda", dtype="float32", kv_dtype=kv_dtype, max_context=1024)
    llm = LLM(one_layer_dir, cache_reuse=16, **on_cuda)
    _run(llm, head + dropped + kept)
    out = _run(llm, head + kept + new)
    assert out.num_cached_tokens == 48 + 70
    cold = _run(LLM(one_layer_dir, **on_cuda), head + kept + new)
    assert out.token_ids == cold.token_ids
    for token, got, want in zip(out.token_ids, out.logprobs, cold.logprobs, strict=True):
        assert abs(got[token] - want[token]) < 5e-2


def test_a_deeper_model_takes_the_pages_too(dense_dir):
    head, dropped, kept = _tokens(48, 1), _tokens(40, 2), _tokens(70, 3)
    llm = LLM(dense_dir, cache_reuse=16)
    _run(llm, head + dropped + kept)
    out = _run(llm, head + kept + [7])
    assert out.num_cached_tokens == 48 + 70 and len(out.token_ids) == 6


def test_runs_shorter_than_the_minimum_and_evicted_sources_are_not_taken(dense_dir):
    head, dropped, kept = _tokens(32, 5), _tokens(20, 6), _tokens(40, 7)
    llm = LLM(dense_dir, cache_reuse=64)  # longer than `kept`
    _run(llm, head + dropped + kept)
    assert _run(llm, head + kept + [9]).num_cached_tokens == 32
    llm = LLM(dense_dir, cache_reuse=16)
    _run(llm, head + dropped + kept)
    llm.reset_prefix_cache()  # the source's pages are no longer named
    assert _run(llm, head + kept + [9]).num_cached_tokens == 0


def test_an_embedding_is_never_approximated(dense_dir):
    head, dropped, kept = _tokens(48, 1), _tokens(40, 2), _tokens(70, 3)
    llm, plain = LLM(dense_dir, cache_reuse=16), LLM(dense_dir)
    for engine in (llm, plain):
        _run(engine, head + dropped + kept)
    assert llm.embed(head + kept + [7]) == plain.embed(head + kept + [7])  # (both from the head's pages)


def test_what_cache_reuse_cannot_take_is_refused(tmp_path):
    hybrid = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=2), tmp_path / "q35")
    with pytest.raises(NinferError, match="cannot be shifted: leave --cache-reuse out"):
        LLM(hybrid, cache_reuse=256)
    with pytest.raises(NinferError, match="it needs prefix caching on"):
        LLM(hybrid, cache_reuse=256, enable_prefix_caching=False)
    with pytest.raises(NinferError, match="cache_reuse must be 0"):
        LLM(hybrid, cache_reuse=-1)
