"""The start-up warm-up (run on a GPU; called directly here): it leaves nothing a later request or /metrics
could tell from an engine that never ran it."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.errors import NinferError
from engine.warmup import warm_up

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _counters(llm: LLM) -> tuple:
    sched = llm.scheduler
    stats = sched.block_pool.stats
    return (
        sched.num_preemptions,
        sched.num_draft_tokens,
        sched.num_accepted_tokens,
        sched.num_drafts,
        sched.step_tokens.sum,
        list(sched.step_tokens.counts),
        stats.queries,
        stats.hits,
    )


@pytest.mark.parametrize(("arch", "spec"), [("qwen3", "ngram"), ("qwen3_5", "none"), ("qwen3_5", "ngram")])
def test_a_warmed_up_engine_answers_and_counts_as_a_fresh_one(tmp_path, arch, spec):
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=6), tmp_path)
    prompts = [_prompt(70, 1), _prompt(70, 1)[:50] + _prompt(9, 2), _prompt(5, 3)]
    fresh = LLM(path, spec=spec, prefill_chunk=32)
    fresh_counters = _counters(fresh)
    want = [o.token_ids for o in fresh.generate(prompt_token_ids=prompts, sampling_params=GREEDY)]
    llm = LLM(path, spec=spec, prefill_chunk=32)
    free = llm.scheduler.block_pool.num_free_blocks
    warm_up(llm)
    assert _counters(llm) == fresh_counters
    assert (
        llm.scheduler.block_pool.num_cached_blocks == 0 and llm.scheduler.block_pool.num_free_blocks == free
    )
    if llm.scheduler.state_pool is not None:
        assert not llm.scheduler.state_pool.snapshots
    assert llm.runner.sampler.num_live_seeds == 0  # its sampled request's seed is gone before ids restart
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert [o.token_ids for o in outs] == want
    assert [o.request_id for o in outs] == ["req-0", "req-1", "req-2"]
    assert _counters(llm) == _counters(fresh)


def test_an_embedding_model_warms_up_on_its_pooled_path(tmp_path):
    save_tiny(tiny_hf_model("qwen3", tied=False).model, tmp_path)
    want = LLM(tmp_path).embed(_prompt(40, 4))
    llm = LLM(tmp_path)
    warm_up(llm)
    assert llm.scheduler.block_pool.num_cached_blocks == 0 and llm.scheduler.block_pool.stats.queries == 0
    assert llm.embed(_prompt(40, 4)) == want


def test_a_failed_warm_up_is_said_in_a_sentence(tmp_path, monkeypatch):
    path = save_tiny(tiny_hf_model("qwen3", tied=False, seed=6), tmp_path)
    llm = LLM(path, prefill_chunk=32)

    def out_of_memory(sched):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(llm.runner, "execute", out_of_memory)
    with pytest.raises(
        NinferError, match=r"the start-up warm-up \(67 prompt tokens in chunks of 32\) failed: "
    ):
        warm_up(llm)


@pytest.mark.gpu
def test_an_engine_on_cuda_warms_up_as_it_starts(tmp_path, caplog):
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=6), tmp_path)
    with caplog.at_level("INFO", logger="ninfer"):
        llm = LLM(path, device="cuda", dtype="float32", max_context=1024, prefill_chunk=64)
    assert any(r.getMessage().startswith("warm-up: 131 prompt tokens") for r in caplog.records)
    assert _counters(llm) == (0, 0, 0, 0, 0, [0] * len(llm.scheduler.step_tokens.counts), 0, 0)
    assert llm.scheduler.block_pool.num_cached_blocks == 0
