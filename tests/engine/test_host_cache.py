"""The prefix cache's host tier (--host-cache): pages evicted from a full KV pool keep their prefix in host
memory, and a later request with that prefix copies them back (num_cached_tokens counts them) and
generates exactly what it generated when it computed them."""

from __future__ import annotations

import pytest
import torch
from conftest import random_prompt, same_output, save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.cache.block_pool import BlockPool
from engine.cache.host_pool import HostPool

GEN = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)


def test_host_pool_keeps_prefixes_in_lru_order_and_reserves_what_it_hands_back():
    pool = HostPool(2)
    assert pool.put(b"a") is not None and pool.put(b"a") is None  # the same prefix: already held
    slot_b = pool.put(b"b")
    assert pool.lookup([b"a", b"b", b"c"]) == [b"a", b"b"] and pool.lookup([b"c", b"a"]) == []
    slot_c = pool.put(b"c")  # full: the least recently used (a) goes
    assert pool.lookup([b"a"]) == [] and pool.lookup([b"b", b"c"]) == [b"b", b"c"]
    assert pool.take(b"b") == slot_b and pool.lookup([b"b"]) == []
    # the taken slot is reserved until the next step: a put now evicts c rather than reuse it
    assert pool.put(b"d") == slot_c
    pool.end_step()
    assert pool.put(b"e") == slot_b


def test_an_evicted_page_is_copied_out_only_when_it_named_its_prefix():
    pool = BlockPool(2, 4, host_slots=4)
    a, b = pool.allocate(2)
    pool.register(a, b"pa")
    pool.register(b, b"pa")  # a second page with the same prefix takes the name: a is a plain page now
    pool.free([a, b])
    pool.allocate(2)
    swap_out, swap_in = pool.drain_swaps()
    assert [blk for blk, _ in swap_out] == [b] and swap_in == []
    assert pool.lookup_host([b"pa"]) == [b"pa"]


def test_pages_taken_back_from_a_full_host_tier_are_not_pushed_out_by_the_allocation():
    pool = BlockPool(2, 4, host_slots=1)
    a, b = pool.allocate(2)
    pool.register(a, b"pa")
    pool.register(b, b"pb")
    pool.free([a, b])
    (c,) = pool.allocate(1)  # b's page is evicted: pb goes to the tier's one slot
    assert pool.drain_swaps()[0] == [(b, 0)] and pool.lookup([b"pa"]) == [a]
    pool.free([c])
    pool.begin_step()
    # a request finds pb in the tier; its two new pages evict a's (pa), which would push pb out of it
    assert pool.allocate_with_host(2, [b"pb"]) == [c, a]
    swap_out, swap_in = pool.drain_swaps()
    assert swap_in == [(0, c)] and swap_out == []  # the slot is read this step: pa is not copied over it
    assert pool.lookup([b"pb"]) == [c] and pool.lookup_host([b"pa", b"pb"]) == []


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_tiny(
        tiny_hf_model("qwen3", tied=False, head_dim=32), tmp_path_factory.mktemp("q3")
    )  # k8v4: 32


def _evict_and_return(llm: LLM) -> tuple[list, list]:
    """Request A, then B (its pages take A's), then A again: (A's first output, A's second)."""
    a, b = random_prompt(50, 1), random_prompt(50, 2)
    first = llm.generate(prompt_token_ids=a, sampling_params=GEN)[0]
    llm.generate(prompt_token_ids=b, sampling_params=GEN)
    again = llm.generate(prompt_token_ids=a, sampling_params=GEN)[0]
    return first, again


@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "k8v4"])
def test_a_prefix_evicted_to_host_memory_comes_back(qwen3_dir, kv_dtype):
    # a pool of 4 pages (64 tokens): B's 54 tokens take A's pages; 3 of them were full, named pages
    small = dict(kv_capacity=64, max_context=64, max_concurrency=1, kv_dtype=kv_dtype)
    first, again = _evict_and_return(LLM(qwen3_dir, **small, host_cache=1 << 20))
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 48
    assert same_output(again, first)
    # without the tier the prefix is gone: computed again
    _, again = _evict_and_return(LLM(qwen3_dir, **small))
    assert again.num_cached_tokens == 0


def test_a_hybrid_prefix_comes_back_with_its_state_snapshot(tmp_path):
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False), tmp_path)
    small = dict(kv_capacity=64, max_context=64, max_concurrency=1, state_snapshots=8)
    llm = LLM(path, **small, host_cache=1 << 20)
    first, again = _evict_and_return(llm)
    assert again.num_cached_tokens == 48 and same_output(again, first)
    assert llm.scheduler.block_pool.stats.host_hits == 48


def test_host_cache_sizes_are_checked_in_a_sentence(qwen3_dir, monkeypatch):
    import engine.llm

    monkeypatch.setattr(engine.llm, "open_source", lambda *a: pytest.fail("the model was opened first"))
    with pytest.raises(NinferError, match="more than the .* GiB of host memory free"):
        LLM(qwen3_dir, kv_capacity=64, max_context=64, host_cache=1 << 50)  # before the model is opened
    monkeypatch.undo()
    with pytest.raises(NinferError, match="holds no KV page"):
        LLM(qwen3_dir, kv_capacity=64, max_context=64, host_cache=16)
    with pytest.raises(NinferError, match="needs prefix caching on"):
        LLM(qwen3_dir, kv_capacity=64, max_context=64, host_cache=1 << 20, enable_prefix_caching=False)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_the_tier_never_changes_what_is_generated(tmp_path, arch):
    """Twelve requests over three shared prefixes, two at a time through a pool too small for them
    (evictions, preemptions, hits in both tiers): every output equals the one without the tier."""
    path = save_tiny(tiny_hf_model(arch, tied=False, head_dim=32), tmp_path)
    bases = [random_prompt(40, 10 + i) for i in range(3)]
    prompts = [bases[i % 3] + random_prompt(5 + i, 20 + i) for i in range(12)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    small = dict(kv_capacity=112, max_context=64, max_concurrency=2, state_snapshots=4, prefill_chunk=32)
    outs = {}
    for label, extra in (("off", {}), ("on", {"host_cache": 1 << 20})):
        llm = LLM(path, **small, **extra)
        outs[label] = [
            llm.generate(prompt_token_ids=prompts[i : i + 2], sampling_params=params) for i in range(0, 12, 2)
        ]
        if label == "on":
            assert llm.scheduler.block_pool.stats.host_hits > 0 and llm.scheduler.num_preemptions > 0
    for pair_off, pair_on in zip(outs["off"], outs["on"]):
        for off, on in zip(pair_off, pair_on):
            assert same_output(on, off)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_page_copies_run_as_slices_and_move_what_page_by_page_copies_would(device):
    """HostTier.copy coalesces pages and slots that run on together (up or down) into one slice copy a
    tensor; the pages it moves are those a copy page by page moves, in both directions."""
    from engine.cache.kv_layout import KVCache
    from engine.worker.host_kv import HostTier, page_runs, page_tensors

    assert page_runs([(7, 2), (5, 0), (6, 1), (9, 3), (10, 4), (3, 9)]) == [
        (3, 9, 1, 1),
        (5, 0, 3, 1),
        (9, 3, 2, 1),
    ]
    assert page_runs([(5, 9), (4, 10), (6, 8), (8, 1)]) == [(4, 10, 3, -1), (8, 1, 1, 1)]  # slots going down
    assert page_runs([]) == []
    caches = [KVCache.allocate("int8", 12, 4, 2, 8, device) for _ in range(2)]  # data and scales
    for c in caches:
        for t in (c.k_data, c.v_data, c.k_scale, c.v_scale):
            t.copy_(torch.randint(-100, 100, t.shape).to(t.dtype))
    host = HostTier(
        page_tensors(caches), 6, torch.device(device), "--host-cache"
    )  # pinned on CUDA: the copies run asynchronously
    out = [(2, 3), (3, 2), (4, 1), (9, 5), (0, 4), (10, 0)]  # a run down, and single pages
    host.copy(out, [])
    if device == "cuda":
        torch.cuda.synchronize()
    for d, h in host.pairs:
        for b, s in out:
            assert torch.equal(h[s], d[b].cpu())
    back = [(0, 7), (1, 8), (2, 9), (5, 0), (4, 1), (3, 11)]  # a run up, one down (4 -> 1, 5 -> 0)
    assert [step for *_, step in page_runs(back)] == [1, 1, -1]
    want = [(d.clone(), h) for d, h in host.pairs]
    for d, h in want:
        for s, b in back:
            d[b] = h[s]
    host.copy([], back)
    if device == "cuda":
        torch.cuda.synchronize()
    assert all(torch.equal(d, w) for (d, _), (w, _) in zip(host.pairs, want))


def test_an_evicted_prefix_goes_out_and_comes_back_in_one_slice(qwen3_dir, monkeypatch):
    """The tier's slots are handed out so that a request's pages, evicted last page first, and its slots
    run on together, out and back in: one slice copy a tensor each way, not one a page."""
    from engine.worker import host_kv

    copies = []
    real = host_kv.HostTier.copy
    monkeypatch.setattr(
        host_kv.HostTier,
        "copy",
        lambda self, out, back: (
            (copies.append((out, back)) if out or back else None) or real(self, out, back)
        ),
    )
    llm = LLM(qwen3_dir, kv_capacity=64, max_context=64, max_concurrency=1, host_cache=1 << 20)
    first, again = _evict_and_return(llm)
    assert again.num_cached_tokens == 48 and same_output(again, first)
    (out, _), (_, back) = copies[0], copies[-1]
    assert len(out) == len(back) == 3  # A's three full pages
    assert len(host_kv.page_runs(out)) == len(host_kv.page_runs(back)) == 1


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_reset_prefix_cache_forgets_both_tiers_and_the_snapshots(tmp_path, arch):
    """LLM.reset_prefix_cache (vLLM's /reset_prefix_cache): neither a page on the GPU nor one in the host
    tier (nor a hybrid's snapshot) names a prefix afterwards; the output is the one computed cold."""
    path = save_tiny(tiny_hf_model(arch, tied=False, head_dim=32), tmp_path)
    small = dict(kv_capacity=64, max_context=64, max_concurrency=1, state_snapshots=8)
    llm = LLM(path, **small, host_cache=1 << 20)
    first, again = _evict_and_return(llm)  # A's pages now on the GPU again, B's in the tier
    assert again.num_cached_tokens == 48
    llm.reset_prefix_cache()
    pool = llm.scheduler.block_pool
    assert not pool.cached and pool.host.num_used == 0
    if llm.scheduler.state_pool is not None:
        assert not llm.scheduler.state_pool.snapshots
    for seed in (1, 2):
        out = llm.generate(prompt_token_ids=random_prompt(50, seed), sampling_params=GEN)[0]
        assert out.num_cached_tokens == 0
    assert same_output(
        out, LLM(path, **small).generate(prompt_token_ids=random_prompt(50, 2), sampling_params=GEN)[0]
    )
