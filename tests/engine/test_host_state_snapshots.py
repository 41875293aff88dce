"""A hybrid model's state snapshots in the prefix cache's host tier (engine/cache/state_pool.py,
--host-state-snapshots): a snapshot the GPU slots evict is copied to host memory first, and a later request
that resumes there has it copied back into a GPU slot and restores from it, generating exactly what it
generated when it computed the prefix."""

from __future__ import annotations

import pytest
from conftest import random_prompt, same_output, save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.cache.state_pool import StatePool
from engine.scheduler.output import SchedulerOutput

GEN = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3_5", tied=False), tmp_path_factory.mktemp("hybrid"))


def test_an_evicted_snapshot_goes_to_host_memory_and_comes_back_into_a_slot_the_step_does_not_read():
    pool = StatePool(1, 2, host_slots=2)
    a, b = pool.new_snapshot(b"a"), pool.new_snapshot(b"b")
    pool.end_step()
    assert pool.drain_swaps() == ([], [])
    pool.new_snapshot(b"c")  # a (least recent) goes to the host tier: copied out before the step writes
    out, back = pool.drain_swaps()
    assert out == [(a, pool.host.slots[b"a"])] and back == []
    pool.end_step()
    assert pool.find_snapshot(b"a") is None and pool.in_host(b"a")
    host_a = pool.host.slots[b"a"]
    assert pool.take_from_host(b"a") == b  # b's slot: b out to the host tier first, then a in
    out, back = pool.drain_swaps()
    assert out == [(b, pool.host.slots[b"b"])] and back == [(host_a, b)]
    assert set(pool.snapshots) == {b"c", b"a"} and set(pool.host.slots) == {b"b"}
    pool.end_step()
    # a snapshot copied back is written before the step's restores read: never into a slot they read
    pool.find_snapshot(b"c"), pool.find_snapshot(b"a")
    assert not pool.in_host(b"b")
    pool.end_step()
    assert pool.in_host(b"b")
    pool.drop_snapshot(b"b")  # a superseded rolling snapshot leaves the host tier too
    assert pool.num_host_snapshots == 0 and pool.host.put(b"e") is not None
    pool.clear_snapshots()
    assert not pool.snapshots and pool.num_host_snapshots == 0


def test_a_full_host_tier_gives_a_snapshot_back_before_it_takes_another_and_writes_a_slot_once_a_step():
    pool = StatePool(1, 1, host_slots=1)
    pool.new_snapshot(b"a")
    pool.end_step()
    pool.new_snapshot(b"b")  # a out to the only host slot
    pool.end_step()
    pool.drain_swaps()
    slot = pool.take_from_host(b"a")  # its host slot reserved this step: b, evicted for it, is dropped
    assert pool.drain_swaps() == ([], [(0, slot)]) and set(pool.snapshots) == {b"a"}
    pool.end_step()
    two = StatePool(1, 2, host_slots=1)
    two.new_snapshot(b"a")
    s2 = two.new_snapshot(b"b")
    two.end_step()
    two.new_snapshot(b"c"), two.new_snapshot(b"d")  # a, then b out to the one host slot: b's copy only
    assert two.drain_swaps() == ([(s2, 0)], []) and set(two.host.slots) == {b"b"}


def test_a_snapshot_no_conversation_resumes_at_is_not_kept_in_host_memory():
    """An interval point alone (keep_evicted=False) is dropped when evicted; the others go to host memory."""
    pool = StatePool(1, 1, host_slots=2)
    pool.new_snapshot(b"interval", keep_evicted=False)
    pool.end_step()
    pool.new_snapshot(b"prompt end")
    assert pool.drain_swaps() == ([], []) and pool.num_host_snapshots == 0
    pool.end_step()
    pool.new_snapshot(b"next")
    assert len(pool.drain_swaps()[0]) == 1 and set(pool.host.slots) == {b"prompt end"}


def _conversations(llm: LLM) -> list[tuple[int, int, list[int]]]:
    """An agent and its subagent at one request, their turns in turn, both after the same tool list (a
    hint); each turn's prompt renders the reply otherwise than the tokens generated (as a template that
    drops the thinking does), so it resumes at most where the turn before's prompt ended: per turn (prompt
    length, cached tokens, output)."""
    tools = random_prompt(40, 7)
    convs = {"agent": tools + random_prompt(50, 1), "sub": tools + random_prompt(30, 2)}
    rows = []
    for turn in range(4):
        for who in ("agent", "sub"):
            prompt = convs[who]
            llm.add_request(prompt, GEN, snapshot_hints=(40,))
            out = None
            while llm.has_unfinished_requests():
                out = next((o for o, _ in llm.step() if o.finished), out)
            rows.append((len(prompt), out.num_cached_tokens, out))
            convs[who] = prompt + [t + 1 for t in out.token_ids] + random_prompt(30, 10 * turn + len(who))
    return rows


def test_an_agent_and_its_subagent_each_resume_where_their_last_turn_ended(hybrid):
    """With the default four GPU slots at one request, the two conversations' own snapshots (their prompt
    ends, last pages) and the tool list's take more slots than there are: without the host tier a turn
    resumes from the tool list only; with it each turn after the first resumes at its last prompt's end."""
    small = dict(kv_capacity=2048, max_context=1024, max_concurrency=1)
    on = LLM(hybrid, **small)
    assert on.scheduler.state_pool.host.num_slots == 3 * on.scheduler.state_pool.num_snapshots == 12
    with_host = _conversations(on)
    assert on.scheduler.num_state_lost_tokens == 0
    for (before, _, _), (_, cached, _) in zip(with_host, with_host[2:]):
        assert cached == before // 16 * 16
    off = LLM(hybrid, **small, host_state_snapshots=0)
    assert off.scheduler.state_pool.host is None and off.runner.host_states is None
    without = _conversations(off)
    assert any(cached == 32 for _, cached, _ in without[2:]) and off.scheduler.num_state_lost_tokens > 0
    assert all(same_output(a, b) for (_, _, a), (_, _, b) in zip(with_host, without))


def test_the_tier_never_changes_what_is_generated(hybrid):
    """Requests over three shared heads, two at a time, one GPU snapshot slot and eight host ones (resumes
    go through the host tier), sampled and greedy: every output equals a cold engine's."""
    heads = [random_prompt(40, 10 + i) for i in range(3)]
    prompts = [heads[i % 3] + random_prompt(5 + i, 20 + i) for i in range(12)]
    params = [
        SamplingParams(max_tokens=6, temperature=t, seed=i, ignore_eos=True, logprobs=0)
        for i, t in enumerate([0.0, 0.9] * 6)
    ]
    llm = LLM(
        hybrid,
        kv_capacity=512,
        max_context=128,
        max_concurrency=2,
        state_snapshots=1,
        host_state_snapshots=8,
        prefill_chunk=32,
    )
    llm_ref = LLM(hybrid, max_context=128, enable_prefix_caching=False)
    got = [
        llm.generate(prompt_token_ids=prompts[i : i + 2], sampling_params=params[i : i + 2])
        for i in range(0, 12, 2)
    ]
    assert llm.scheduler.state_pool.host.num_slots == 8
    assert sum(o.num_cached_tokens for pair in got for o in pair) > 0
    for i, pair in zip(range(0, 12, 2), got):
        for j, out in enumerate(pair):
            assert same_output(
                out, llm_ref.generate(prompt_token_ids=prompts[i + j], sampling_params=params[i + j])[0]
            )


def test_the_host_tiers_size(hybrid, tmp_path):
    small = dict(kv_capacity=256, max_context=128, max_concurrency=1)
    llm = LLM(hybrid, **small, state_snapshots=3)  # three times as many in host memory
    slot = llm.runner.state_slot_bytes
    assert llm.runner.host_states.num_slots == 9 and llm.runner.host_states.num_bytes == 9 * slot
    # with --host-cache: an eighth of it, the rest KV pages
    llm = LLM(hybrid, **small, host_cache=64 * slot)
    assert llm.runner.host_states.num_slots == 8
    assert llm.runner.host_kv.num_bytes <= 56 * slot
    llm = LLM(hybrid, **small, host_cache=64 * slot, host_state_snapshots=20)
    assert llm.scheduler.state_pool.host.num_slots == 20 and llm.runner.host_kv.num_bytes <= 44 * slot
    with pytest.raises(
        NinferError, match=r"^--host-state-snapshots 64 take .* all of --host-cache .* give at most 63"
    ):
        LLM(hybrid, **small, host_cache=64 * slot, host_state_snapshots=64)
    with pytest.raises(NinferError, match=r"^--host-state-snapshots .* more than the .* GiB free"):
        LLM(hybrid, **small, host_state_snapshots=1 << 40)
    # none without GPU snapshots to evict from, nor for a model without recurrent state
    assert LLM(hybrid, **small, state_snapshots=0).runner.host_states is None
    plain = save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path)
    assert LLM(plain, **small, host_state_snapshots=4).runner.host_states is None
    with pytest.raises(NinferError, match="must be >= 0"):
        LLM(hybrid, **small, host_state_snapshots=-1)
    with pytest.raises(NinferError, match="needs prefix caching on"):
        LLM(hybrid, **small, host_state_snapshots=2, enable_prefix_caching=False)


def test_reset_and_a_failed_step_forget_the_host_tiers_snapshots(hybrid):
    llm = LLM(hybrid, kv_capacity=512, max_context=128, max_concurrency=1, state_snapshots=1)
    for seed in (1, 2, 3):
        llm.generate(prompt_token_ids=random_prompt(40, seed), sampling_params=GEN)
    pool = llm.scheduler.state_pool
    assert pool.num_host_snapshots > 0
    llm.reset_prefix_cache()
    assert pool.num_host_snapshots == 0 and not pool.snapshots
    for seed in (1, 2):
        llm.generate(prompt_token_ids=random_prompt(40, seed), sampling_params=GEN)
    assert pool.num_host_snapshots > 0
    # a step that failed while copying snapshots to or from the host tier: they may be half-written
    llm.scheduler.step_failed(SchedulerOutput([], [], state_swap_in=[(0, 1)]))
    assert pool.num_host_snapshots == 0 and not pool.snapshots


def test_the_prefix_cache_file_keeps_the_host_tiers_snapshots(hybrid, tmp_path):
    """--prefix-cache-file writes the host tier's snapshots beside the GPU slots'; the next start reads the
    newest into the GPU slots and those before them into the host tier: every prompt resumes after it."""
    opts = dict(kv_capacity=512, max_context=128, max_concurrency=1, state_snapshots=1, host_cache=1 << 20)
    opts.update(host_state_snapshots=6, prefix_cache_file=str(tmp_path / "prefix.cache"))
    llm = LLM(hybrid, **opts)
    prompts = [random_prompt(40, seed) for seed in (1, 2, 3)]  # each snapshotted at its prompt's end (32)
    want = [llm.generate(prompt_token_ids=p, sampling_params=GEN)[0] for p in prompts]
    assert len(llm.scheduler.state_pool.snapshots) == 1 and llm.scheduler.state_pool.num_host_snapshots == 2
    llm.save_prefix_cache()
    again = LLM(hybrid, **opts)
    pool = again.scheduler.state_pool
    assert len(pool.snapshots) == 1 and pool.num_host_snapshots == 2
    for prompt, out in zip(prompts, want):
        got = again.generate(prompt_token_ids=prompt, sampling_params=GEN)[0]
        assert got.num_cached_tokens == 32 and same_output(got, out)


def test_a_conversation_whose_first_page_another_matched_keeps_its_prefix(hybrid):
    """A hybrid model computes a conversation's first page again when another prompt's matched it but no
    snapshot did; once that other copy is evicted, the conversation's next turn still finds its whole
    prefix (its own copy carries the name), not nothing."""
    llm = LLM(hybrid, kv_capacity=256, max_context=256, max_concurrency=1)  # 16 pages
    head = random_prompt(16, 1)  # one page shared by two conversations
    llm.generate(prompt_token_ids=head + random_prompt(30, 2), sampling_params=GEN)
    first = head + random_prompt(30, 3)
    llm.generate(prompt_token_ids=first, sampling_params=GEN)
    # 14 pages: the 8 never used, then the 6 oldest of the others: the first conversation's (the shared
    # page among them), the second's last (partial) page
    llm.generate(prompt_token_ids=random_prompt(212, 4), sampling_params=GEN)
    again = llm.generate(prompt_token_ids=first + random_prompt(8, 5), sampling_params=GEN)[0]
    assert again.num_cached_tokens == 32


def test_host_memory_that_cannot_be_had_turns_the_default_tier_off_and_refuses_one_asked_for(
    hybrid, monkeypatch, caplog
):
    import logging

    from engine.worker.model_runner import ModelRunner

    def refuse(self, n):
        raise NinferError(f"could not pin 0.1 GiB of host memory for --host-state-snapshots ({n})")

    monkeypatch.setattr(ModelRunner, "attach_host_states", refuse)
    small = dict(kv_capacity=256, max_context=128, max_concurrency=1)
    with caplog.at_level(logging.WARNING, logger="ninfer"):
        llm = LLM(hybrid, **small)
    assert llm.scheduler.state_pool.host is None
    assert any("running without host-memory state snapshots" in r.message for r in caplog.records)
    assert llm.generate(prompt_token_ids=random_prompt(20, 1), sampling_params=GEN)[0].token_ids
    with pytest.raises(NinferError, match="could not pin"):
        LLM(hybrid, **small, host_state_snapshots=4)


def test_a_snapshot_computed_again_on_the_gpu_leaves_the_host_tier():
    """A prefix the host tier holds, saved again into a GPU slot (its request computed it, no idle slot
    having been free to take it back): the host copy goes, its slot free, so the tiers stay exclusive."""
    pool = StatePool(1, 1, host_slots=2)
    pool.new_snapshot(b"a")
    pool.end_step()
    pool.new_snapshot(b"b")  # a out to the host tier
    pool.end_step()
    assert set(pool.host.slots) == {b"a"}
    pool.drain_swaps()
    assert pool.new_snapshot(b"a") is not None  # b out, a saved on the GPU again
    assert set(pool.host.slots) == {b"b"} and set(pool.snapshots) == {b"a"}
