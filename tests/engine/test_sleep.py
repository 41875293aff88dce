"""Sleep (engine/worker/sleep.py): the device memory given back while idle and taken again on the next
request. Level 1 holds the weights, KV pool and recurrent states in host memory (the prefix cache hits after
waking); level 2 holds the weights only (the prefix cache starts cold). Either way a request after waking
generates what it generated before, to the log-probability."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import random_prompt, same_output, save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.async_llm import AsyncLLM
from engine.errors import DeviceMemoryBusy
from engine.worker import sleep as sleep_module
from engine.worker.sleep import DeviceMemory

GEN = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=0)
SMALL = dict(max_context=256, kv_capacity=512, max_concurrency=2)


class _Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.cache = SimpleNamespace(pages=torch.randn(6, 4))  # not ours, not a module: not walked
        self.pages = torch.randn(6, 4)
        self.rows = self.pages[2:]  # a view: the same storage
        self.nested = {"states": [torch.ones(3)]}


def test_release_frees_every_storage_reached_and_restore_brings_its_bytes_back():
    m = _Holder()
    weight, pages = m.linear.weight.detach().clone(), m.pages.clone()
    memory = DeviceMemory([m], torch.device("cpu"), discard=[m.nested["states"][0]])
    # the linear's weight and bias, the pages (once, with their view), the states; not SimpleNamespace's
    assert memory.device_bytes == 4 * (32 + 4 + 24 + 3) and memory.host_bytes == 4 * (32 + 4 + 24)
    memory.release()
    assert m.linear.weight.untyped_storage().nbytes() == 0 and m.rows.untyped_storage().nbytes() == 0
    assert m.cache.pages.untyped_storage().nbytes() == 24 * 4  # out of the walk's reach: kept
    memory.restore()
    assert torch.equal(m.linear.weight, weight) and torch.equal(m.pages, pages)
    assert torch.equal(m.rows, pages[2:]) and m.nested["states"][0].tolist() == [0.0, 0.0, 0.0]


def test_skipped_objects_are_not_walked_and_discarded_storages_are_not_kept():
    """skip (the CUDA graphs) and discard (the KV pool at level 2) together: what only a skipped object holds
    is left out, a discarded storage is freed but not copied."""
    m = _Holder()
    m.graphs = torch.nn.Module()
    m.graphs.register_buffer("static", torch.ones(10))
    memory = DeviceMemory([m], torch.device("cpu"), discard=[m.pages], skip=[m.graphs])
    assert memory.device_bytes == 4 * (32 + 4 + 24 + 3) and memory.host_bytes == 4 * (32 + 4 + 3)
    memory.release()
    assert m.graphs.static.untyped_storage().nbytes() == 40 and m.pages.untyped_storage().nbytes() == 0


def test_a_storage_that_cannot_be_resized_keeps_its_memory():
    import numpy as np

    mapped = torch.from_numpy(np.ones(5, dtype=np.float32))  # memory torch did not allocate
    assert not mapped.untyped_storage().resizable()
    holder = torch.nn.Module()
    holder.register_buffer("mapped", mapped)
    memory = DeviceMemory([holder], torch.device("cpu"))
    assert memory.device_bytes == 0
    memory.release()
    assert mapped.tolist() == [1.0] * 5


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def model_dir(request, tmp_path_factory):
    return save_tiny(tiny_hf_model(request.param, tied=False), tmp_path_factory.mktemp(request.param))


def test_level_1_keeps_the_prefix_cache_and_level_2_drops_it(model_dir):
    llm = LLM(model_dir, **SMALL)
    prompt = random_prompt(70, 1)
    first = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    message = llm.sleep(1)
    assert (
        llm.sleep_level == 1
        and message.startswith("asleep (level 1)")
        and "the next request wakes it" in message
    )
    assert all(p.untyped_storage().nbytes() == 0 for p in llm.model.parameters())
    assert all(c.k_data.untyped_storage().nbytes() == 0 for c in llm.runner.kv_caches)
    assert llm.sleep(1) == "already asleep (level 1)"
    again = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]  # the request wakes it
    assert llm.sleep_level == 0 and again.num_cached_tokens == 64 and same_output(again, first, tol=1e-5)
    llm.sleep(2)
    assert llm.sleep_level == 2
    cold = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    assert cold.num_cached_tokens == 0 and same_output(cold, first, tol=1e-5)
    assert llm.wake_up() == "awake"
    # asleep at level 1, then level 2: deepened in place (no wake): the KV pool's host copy let go
    llm.sleep(1)
    held, kv = llm.runner.asleep.host_bytes, llm.runner.kv_cache_bytes
    deeper = llm.sleep(2)
    assert llm.sleep_level == 2 and deeper.startswith("asleep (level 2): ") and llm.runner.asleep is not None
    assert "of host memory freed, the prefix cache dropped" in deeper and "not written" not in deeper
    assert held - llm.runner.asleep.host_bytes >= kv > 0
    assert llm.sleep(1) == llm.sleep(2) == "already asleep (level 2)"
    cold = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    assert cold.num_cached_tokens == 0 and same_output(cold, first, tol=1e-5)


def test_a_model_asleep_leaves_another_model_of_the_process_be(model_dir):
    # both read the process's shared rotary tables, which a sleeping model must not free
    asleep, awake = LLM(model_dir, **SMALL), LLM(model_dir, **SMALL)
    prompt = random_prompt(30, 7)
    first = awake.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    asleep.sleep(1)
    again = awake.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    assert again.num_cached_tokens == 16 and same_output(again, first, tol=1e-5)


def test_sleep_is_refused_while_requests_run_or_wait_and_for_an_unknown_level(model_dir):
    llm = LLM(model_dir, **SMALL)
    with pytest.raises(NinferError, match="^sleep level 3 is not one of 1"):
        llm.sleep(3)
    llm.add_request(random_prompt(20, 2), GEN)
    with pytest.raises(NinferError, match=r"^1 request\(s\) are running or waiting; sleep once they finish$"):
        llm.sleep(1)
    while llm.has_unfinished_requests():
        llm.step()
    llm.sleep(1)


def test_host_memory_too_short_refuses_sleep_and_changes_nothing(model_dir, monkeypatch):
    llm = LLM(model_dir, **SMALL)
    prompt = random_prompt(40, 3)
    first = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    monkeypatch.setattr(sleep_module, "host_memory_free", lambda: 0)
    with pytest.raises(
        NinferError, match="^sleeping needs .* of host memory to hold the device's bytes and 0 B"
    ):
        llm.sleep(1)
    assert llm.sleep_level == 0
    again = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    assert again.num_cached_tokens == 32 and same_output(again, first, tol=1e-5)


def test_a_wake_the_device_cannot_hold_stays_asleep_and_can_be_tried_again(model_dir, monkeypatch):
    llm = LLM(model_dir, **SMALL)
    prompt = random_prompt(40, 4)
    first = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    llm.sleep(1)
    real, calls = sleep_module._bytes_of, []

    def short_of_memory(storage, device):  # the third storage finds the device full
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("out of memory")
        return real(storage, device)

    monkeypatch.setattr(sleep_module, "_bytes_of", short_of_memory)
    with pytest.raises(
        DeviceMemoryBusy, match="^waking up needs .* of device memory and .* are free; stop what"
    ):
        llm.generate(prompt_token_ids=prompt, sampling_params=GEN)
    assert llm.sleep_level == 1 and not llm.has_unfinished_requests()
    assert all(p.untyped_storage().nbytes() == 0 for p in llm.model.parameters())  # what was taken: freed
    again = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]  # the device has room now
    assert llm.sleep_level == 0 and again.num_cached_tokens == 32 and same_output(again, first, tol=1e-5)


def test_a_refused_request_does_not_wake_the_engine(model_dir):
    llm = LLM(model_dir, **SMALL)
    llm.sleep(1)
    with pytest.raises(NinferError, match="outside the vocabulary"):
        llm.add_request([10**7], GEN)
    assert llm.sleep_level == 1


def _generate(engine: AsyncLLM, prompt: list[int]):
    async def main():
        stream = await engine.add_request(prompt, GEN)
        async for out, _ in stream:
            last = out
        return last

    return asyncio.run(main())


def _stamp(file) -> tuple[int, int]:
    """Which write of the file this is (each is a new file moved into place)."""
    st = file.stat()
    return st.st_ino, st.st_mtime_ns


def _wait_for_level(engine: AsyncLLM, level: int) -> None:
    deadline = time.monotonic() + 20
    while engine.stats()["sleep_level"] != level:
        assert time.monotonic() < deadline, f"the engine did not fall asleep at level {level}"
        time.sleep(0.05)


def test_the_server_engine_sleeps_when_idle_and_the_next_request_wakes_it(model_dir):
    engine = AsyncLLM(model_dir, **SMALL, sleep_idle_seconds=0.3)
    try:
        prompt = random_prompt(40, 5)
        first = _generate(engine, prompt)
        _wait_for_level(engine, 1)
        again = _generate(engine, prompt)
        assert again.num_cached_tokens == 32 and same_output(again, first, tol=1e-5)
        _wait_for_level(engine, 1)  # asleep again, 0.3 s after that request
        assert asyncio.run(engine.wake_up()).startswith("awake in")
    finally:
        engine.shutdown()


def test_idle_sleep_falls_back_to_level_2_then_stays_awake_when_memory_is_short(
    model_dir, monkeypatch, caplog
):
    # host memory for the weights and half the KV pool (sized on a twin, before this engine can sleep):
    # level 1 is refused, level 2 fits
    twin = LLM(model_dir, **SMALL)
    room = sum(twin.sleep_host_bytes()) // 2
    monkeypatch.setattr(sleep_module, "host_memory_free", lambda: room)
    engine = AsyncLLM(model_dir, **SMALL, sleep_idle_seconds=0.2)
    try:
        _generate(engine, random_prompt(40, 6))
        _wait_for_level(engine, 2)
        # no host memory now: waking needs none, the next sleep is refused once and not tried again
        monkeypatch.setattr(sleep_module, "host_memory_free", lambda: 0)
        with caplog.at_level(logging.WARNING, logger="ninfer"):
            _generate(engine, random_prompt(40, 6))
            time.sleep(1.0)  # five idle periods
        assert engine.llm.sleep_level == 0 and engine.is_running
        assert sum("staying awake" in r.message for r in caplog.records) == 1
    finally:
        engine.shutdown()


def test_the_prefix_cache_file_is_written_asleep(model_dir, tmp_path):
    """Shutdown asleep at level 1: the engine wakes to write its pages. Level 2 writes them before it drops
    them, and the file keeps them: a shutdown asleep leaves it as it is, and the next start hits."""
    file = tmp_path / "prefix.cache"
    options = dict(**SMALL, host_cache=1 << 20, prefix_cache_file=str(file))
    prompt, other = random_prompt(40, 8), random_prompt(40, 11)
    engine = AsyncLLM(model_dir, **options)
    first = _generate(engine, prompt)
    asyncio.run(engine.sleep(1))
    engine.shutdown()
    assert engine.llm.sleep_level == 0 and file.exists()
    again = LLM(model_dir, **options)
    out = again.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    assert out.num_cached_tokens == 32 and same_output(out, first, tol=1e-5)
    second = again.generate(prompt_token_ids=other, sampling_params=GEN)[0]  # new pages: written at level 2
    again.sleep(2)
    written = _stamp(file)
    again.save_prefix_cache()  # (what a shutdown does)
    assert again.sleep_level == 2 and _stamp(file) == written
    later = LLM(model_dir, **options).generate(prompt_token_ids=[prompt, other], sampling_params=GEN)
    assert [o.num_cached_tokens for o in later] == [32, 32] and same_output(later[1], second, tol=1e-5)


def test_deepening_to_level_2_says_when_the_file_misses_the_latest_cache(model_dir, tmp_path):
    """Asleep at level 1 by hand (no file written), then level 2: the cache is dropped without waking to
    write it, and the message says the file does not hold it; after the file is written, it does not."""
    file = tmp_path / "prefix.cache"
    llm = LLM(model_dir, **SMALL, host_cache=1 << 20, prefix_cache_file=str(file))
    llm.generate(prompt_token_ids=random_prompt(40, 8), sampling_params=GEN)
    llm.sleep(1)
    assert f"the latest prefix cache was not written to {file}" in llm.sleep(2) and not file.exists()
    llm.generate(prompt_token_ids=random_prompt(40, 9), sampling_params=GEN)
    llm.save_prefix_cache()
    llm.sleep(1)
    assert "not written" not in llm.sleep(2) and file.exists()


def test_idle_sleep_writes_the_prefix_cache_file_first_and_shutdown_need_not_wake(
    model_dir, tmp_path, caplog
):
    """A server that falls asleep idle writes its prefix cache file (a crash while asleep keeps it); shut
    down later with nothing new cached, it leaves the file as it is, asleep."""
    file = tmp_path / "prefix.cache"
    options = dict(**SMALL, host_cache=1 << 20, prefix_cache_file=str(file))
    prompt = random_prompt(40, 9)
    engine = AsyncLLM(model_dir, **options, sleep_idle_seconds=0.2)
    try:
        first = _generate(engine, prompt)
        _wait_for_level(engine, 1)
        assert file.exists()
        # another process reading the file now (this one could crash asleep) starts from its pages
        out = LLM(model_dir, **options).generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
        assert out.num_cached_tokens == 32 and same_output(out, first, tol=1e-5)
        written = _stamp(file)
    finally:
        with caplog.at_level(logging.INFO, logger="ninfer"):
            engine.shutdown()
    assert engine.llm.sleep_level == 1 and _stamp(file) == written
    assert any("unchanged since" in r.message for r in caplog.records)


def test_the_prefix_cache_file_is_written_again_only_when_the_cache_changed(model_dir, tmp_path):
    file = tmp_path / "prefix.cache"
    options = dict(**SMALL, host_cache=1 << 20, prefix_cache_file=str(file))
    llm = LLM(model_dir, **options)
    llm.generate(prompt_token_ids=random_prompt(40, 10), sampling_params=GEN)
    llm.save_prefix_cache()
    written = _stamp(file)
    llm.save_prefix_cache()
    assert _stamp(file) == written
    again = LLM(model_dir, **options)  # read: what it holds is the file's
    again.save_prefix_cache()
    assert _stamp(file) == written
    again.reset_prefix_cache()  # forgotten: the file follows
    again.save_prefix_cache()
    assert _stamp(file) != written
    cold = LLM(model_dir, **options).generate(prompt_token_ids=random_prompt(40, 10), sampling_params=GEN)[0]
    assert cold.num_cached_tokens == 0


def test_start_up_says_what_sleeping_will_hold_and_warns_when_host_memory_cannot(model_dir, monkeypatch):
    from ninfer_cli.serve import sleep_summary

    llm = LLM(model_dir, **SMALL)
    full, weights = llm.sleep_host_bytes()
    assert full - weights == llm.runner.kv_cache_bytes + sum(
        t.numel() * t.element_size() for t in llm.runner._state_tensors()
    )

    def free(n):
        monkeypatch.setattr(sleep_module, "host_memory_free", lambda: n)

    free(full)
    level, line = sleep_summary(llm, 300)
    assert level == logging.INFO and line.startswith("sleeps after 300 s without a request, holding ")
    free(full - 1)
    level, line = sleep_summary(llm, 300)
    assert level == logging.WARNING and "it will sleep at level 2, holding the weights" in line
    free(weights - 1)
    level, line = sleep_summary(llm, 300)
    assert level == logging.WARNING and "cannot hold the weights" in line and "it will stay awake" in line


def test_a_host_allocation_that_fails_refuses_the_sleep_and_changes_nothing(model_dir, monkeypatch):
    llm = LLM(model_dir, **SMALL)
    prompt = random_prompt(40, 12)
    first = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    calls = []

    def refusing(self, nbytes):  # the third host buffer cannot be had
        calls.append(nbytes)
        if len(calls) == 3:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return torch.empty(nbytes, dtype=torch.uint8)

    monkeypatch.setattr(DeviceMemory, "_host_buffer", refusing)
    with pytest.raises(
        NinferError, match="^sleeping could not take .* of host memory \\(DefaultCPUAllocator"
    ):
        llm.sleep(1)
    assert llm.sleep_level == 0 and all(p.untyped_storage().nbytes() > 0 for p in llm.model.parameters())
    again = llm.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
    assert again.num_cached_tokens == 32 and same_output(again, first, tol=1e-5)
