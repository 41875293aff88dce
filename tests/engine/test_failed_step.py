"""A step that raises ends its own requests with finish_reason "error"; the engine goes on with the others,
and nothing it leaves behind (pages, state slots, prefix-cache entries) changes a later reply."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM, EngineDeadError

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):  # Qwen3.5: recurrent states, and their snapshots in the prefix cache
    return save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=2), tmp_path_factory.mktemp("q35"))


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3", tied=False, seed=3), tmp_path_factory.mktemp("q3"))


def _fail_once(monkeypatch, obj, name: str, when) -> list[int]:
    """Make obj.name raise RuntimeError the first time `when(*args)` holds; returns a list that counts it."""
    real, failed = getattr(obj, name), []

    def patched(*args, **kwargs):
        if not failed and when(*args):
            failed.append(1)
            raise RuntimeError("boom in the step")
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, patched)
    return failed


def _scheduled(request_id: str):
    return lambda sched, *_: any(s.request_id == request_id for s in sched.scheduled)


def _run(llm: LLM, ids: dict[str, list[int]]) -> dict[str, object]:
    for rid, prompt in ids.items():
        llm.add_request(prompt, GREEDY, rid)
    done = {}
    while llm.has_unfinished_requests():
        for out, _ in llm.step():
            if out.finished:
                done[out.request_id] = out
    return done


@pytest.mark.parametrize("stage", ["execute", "update"])
def test_the_failed_steps_request_errs_and_the_waiting_one_runs_as_on_a_fresh_engine(
    hybrid_dir, monkeypatch, stage
):
    a, b = _prompt(40, 1), _prompt(23, 2)
    fresh = LLM(hybrid_dir, max_concurrency=1)
    expected = _run(fresh, {"b": b})["b"].token_ids
    llm = LLM(hybrid_dir, max_concurrency=1)  # b waits while a runs
    free_blocks, free_slots = (
        llm.scheduler.block_pool.num_free_blocks,
        llm.scheduler.state_pool.num_free_slots,
    )
    if stage == "execute":
        failed = _fail_once(monkeypatch, llm.runner, "execute", _scheduled("a"))
    else:  # after the model ran: the scheduler's bookkeeping of the step's tokens
        failed = _fail_once(monkeypatch, llm.scheduler, "update_from_output", _scheduled("a"))
    outs = _run(llm, {"a": a, "b": b})
    assert failed
    assert outs["a"].finish_reason == "error"
    assert (
        "RuntimeError: boom in the step" in outs["a"].error
        and "goes on with other requests" in outs["a"].error
    )
    assert outs["b"].finish_reason == "length" and outs["b"].token_ids == expected
    assert llm.scheduler.block_pool.num_free_blocks == free_blocks  # nothing leaked
    assert llm.scheduler.state_pool.num_free_slots == free_slots


def test_a_failure_mid_decode_keeps_the_tokens_so_far_and_frees_everything(dense_dir, monkeypatch):
    llm = LLM(dense_dir)
    free_blocks = llm.scheduler.block_pool.num_free_blocks
    steps = []
    failed = _fail_once(monkeypatch, llm.runner, "execute", lambda sched: steps.append(1) or len(steps) == 4)
    out = _run(llm, {"a": _prompt(30, 4)})["a"]
    assert failed and out.finish_reason == "error" and len(out.token_ids) == 3
    assert llm.scheduler.block_pool.num_free_blocks == free_blocks
    assert (
        _run(llm, {"again": _prompt(30, 4)})["again"].token_ids
        == _run(LLM(dense_dir), {"x": _prompt(30, 4)})["x"].token_ids
    )


def test_a_snapshot_the_failed_step_was_to_fill_is_forgotten(hybrid_dir, monkeypatch):
    """The prompt's page-aligned recurrent state is named in the prefix cache when its step is scheduled and
    copied while it runs: a failed step leaves the name on a state never written, which a later request
    with the same prompt restores where the prompt's pages are cached (here by a longer prompt before)."""
    prompt = _prompt(70, 5)
    expected = _run(LLM(hybrid_dir), {"x": prompt})["x"].token_ids
    llm = LLM(hybrid_dir)
    _run(llm, {"longer": prompt + _prompt(30, 6)})  # its pages hold the prompt's; its snapshots are past them
    failed = _fail_once(monkeypatch, llm.runner, "execute", lambda sched: bool(sched.state_saves))
    assert _run(llm, {"a": prompt})["a"].finish_reason == "error" and failed
    assert _run(llm, {"b": prompt})["b"].token_ids == expected


def test_the_prefix_cache_stays_when_the_failed_step_filled_none_of_it(dense_dir, monkeypatch):
    prompt = _prompt(70, 6)
    llm = LLM(dense_dir)
    _run(llm, {"warm": prompt})
    cached = llm.scheduler.block_pool.num_cached_blocks
    assert cached
    failed = _fail_once(monkeypatch, llm.runner, "execute", _scheduled("a"))
    assert _run(llm, {"a": prompt + [7, 8]})["a"].finish_reason == "error" and failed
    assert llm.scheduler.block_pool.num_cached_blocks == cached
    assert _run(llm, {"b": prompt})["b"].num_cached_tokens > 0


def test_a_device_that_stopped_working_stops_the_engine(dense_dir, monkeypatch):
    llm = LLM(dense_dir)
    _fail_once(monkeypatch, llm.runner, "execute", lambda sched: True)
    monkeypatch.setattr(llm.runner, "device_works", lambda: False)
    llm.add_request(_prompt(10, 7), GREEDY)
    with pytest.raises(RuntimeError, match="boom"):
        llm.step()


def test_the_async_engine_goes_on_after_a_failed_step(dense_dir, monkeypatch):
    engine = AsyncLLM(dense_dir)
    try:
        failed = _fail_once(monkeypatch, engine.llm.runner, "execute", lambda sched: bool(sched.scheduled))

        async def last(prompt):
            outs = [out async for out, _ in engine.generate(prompt, GREEDY)]
            return outs[-1]

        first = asyncio.run(last(_prompt(12, 8)))
        assert failed and first.finish_reason == "error" and "boom" in first.error
        assert engine.is_running
        assert asyncio.run(last(_prompt(12, 8))).finish_reason == "length"
    finally:
        engine.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_async_engine_stops_when_the_device_does(dense_dir, monkeypatch):
    engine = AsyncLLM(dense_dir)
    try:
        _fail_once(monkeypatch, engine.llm.runner, "execute", lambda sched: bool(sched.scheduled))
        monkeypatch.setattr(engine.llm.runner, "device_works", lambda: False)

        async def main():
            async for _ in engine.generate(_prompt(12, 9), GREEDY):
                pass

        with pytest.raises(EngineDeadError, match="boom"):
            asyncio.run(main())
        assert not engine.is_running
    finally:
        engine.shutdown()


def test_a_request_that_fails_to_be_added_is_refused_and_the_engine_goes_on(dense_dir, monkeypatch):
    engine = AsyncLLM(dense_dir)
    try:
        failed = _fail_once(monkeypatch, engine.llm, "_with_hidden_stops", lambda params: True)

        async def main():
            with pytest.raises(RuntimeError, match="boom"):
                await engine.add_request(_prompt(12, 10), GREEDY)
            return [out async for out, _ in engine.generate(_prompt(12, 10), GREEDY)][-1]

        assert asyncio.run(main()).finish_reason == "length" and failed
        assert engine.is_running and not engine.llm.scheduler.requests
    finally:
        engine.shutdown()
