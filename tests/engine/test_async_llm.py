"""AsyncLLM: concurrent async streams equal offline runs; refusals raise in the caller; closing frees."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.async_llm import AsyncLLM
from engine.errors import EngineOverloaded, NinferError


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=2), tmp_path_factory.mktemp("q35"))


@pytest.fixture
def engine(model_dir):
    eng = AsyncLLM(model_dir, max_concurrency=4)
    yield eng
    eng.shutdown()


def _wait_until(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_concurrent_streams_equal_offline_runs(engine, model_dir):
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    prompts = [_prompt(n, n) for n in (5, 40, 90, 12, 1, 60)]
    offline = LLM(model_dir).generate(prompt_token_ids=prompts, sampling_params=params)

    async def one(p):
        tokens, last = [], None
        async for out, _ in engine.generate(p, params):
            tokens, last = out.token_ids, out
        assert last.finished and last.finish_reason == "length"
        return tokens

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    assert asyncio.run(main()) == [o.token_ids for o in offline]


def test_bad_request_raises_in_the_caller(engine):
    async def main():
        with pytest.raises(NinferError, match="outside the vocabulary"):
            await engine.add_request([10**6], SamplingParams())
        with pytest.raises(NinferError, match="empty"):
            await engine.add_request([], SamplingParams())

    asyncio.run(main())
    assert engine.is_running


def test_leaving_a_stream_early_frees_its_pages(engine):
    pool = engine.llm.scheduler.block_pool
    free = pool.num_free_blocks

    async def main():
        params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
        async for out, _ in engine.generate(_prompt(70, 3), params):
            if len(out.token_ids) == 3:
                break  # the client went away

    asyncio.run(main())
    _wait_until(lambda: not engine.llm.scheduler.requests)
    assert pool.num_free_blocks == free
    assert engine.llm.scheduler.state_pool.num_free_slots == 4


def test_abort_wakes_a_reader_waiting_for_the_next_output(engine):
    """A client that goes away aborts its stream from another task (the server's disconnect watcher):
    the task reading the stream ends then, instead of waiting forever for an output that never comes."""

    async def main():
        params = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
        stream = await engine.add_request(_prompt(70, 4), params)
        seen = []

        async def read():
            async for out, _ in stream:
                seen.append(out)

        reader = asyncio.create_task(read())
        while not seen:
            await asyncio.sleep(0.01)
        stream.abort()
        await asyncio.wait_for(reader, timeout=10)  # ends (a hang would time out)
        return seen

    seen = asyncio.run(main())
    assert seen and not seen[-1].finished
    _wait_until(lambda: not engine.llm.scheduler.requests)


def test_overloaded_and_expired(model_dir):
    eng = AsyncLLM(model_dir, max_concurrency=1, max_pending=1, pending_timeout_ms=50)
    try:

        async def main():
            long = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
            first = await eng.add_request(_prompt(8, 1), long)
            await anext(first)  # running
            queued = await eng.add_request(_prompt(8, 2), long)
            with pytest.raises(EngineOverloaded, match="max_pending=1"):
                await eng.add_request(_prompt(8, 3), long)
            out, _ = await anext(queued)  # never admitted while the first runs: it expires
            first.abort()
            return out

        out = asyncio.run(main())
        assert out.finish_reason == "expired" and out.token_ids == []
        assert "expired while waiting for admission" in out.error and "--pending-timeout-ms" in out.error
    finally:
        eng.shutdown()
