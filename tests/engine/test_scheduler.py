"""The scheduler on CPU, without a model: budgets, admission, chunked prefill, preemption, freeing."""

from __future__ import annotations

import pytest

from engine.cache.block_pool import BlockPool, hash_blocks
from engine.cache.state_pool import StatePool
from engine.config import SchedulerConfig
from engine.errors import EngineOverloaded, NinferError
from engine.request import Request, SamplingParams
from engine.scheduler.output import RunnerOutput, SampledToken
from engine.scheduler.scheduler import Scheduler


def make(
    num_blocks=64,
    block_size=4,
    max_num_seqs=4,
    budget=32,
    max_len=256,
    slots=None,
    prefix_caching=False,
    snapshots=0,
    **config,
):
    pool = StatePool(slots, snapshots) if slots else None
    cfg = SchedulerConfig(max_concurrency=max_num_seqs, prefill_chunk=budget, max_context=max_len, **config)
    return Scheduler(cfg, BlockPool(num_blocks, block_size, prefix_caching), pool)


def req(rid, n, max_tokens=4, **kw):
    return Request(
        rid, list(range(3, 3 + n)), SamplingParams(max_tokens=max_tokens, **kw), eos_token_ids=(2,)
    )


def run_step(s, token=7):
    out = s.schedule()
    sampled = {r.request_id: [SampledToken(token, None)] for r in out.scheduled if r.sample}
    s.update_from_output(out, RunnerOutput(sampled))
    return out


def test_prefill_then_decode_one_token_each():
    s = make()
    s.add_request(req("a", 10))
    s.add_request(req("b", 3))
    out = run_step(s)
    assert out.num_scheduled_tokens == {"a": 10, "b": 3}
    assert all(r.sample for r in out.scheduled)
    out = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert [r.start_pos for r in out.scheduled] == [10, 3]


def test_chunked_prefill_respects_budget_and_samples_only_at_the_end():
    s = make(budget=8)
    s.add_request(req("a", 20))
    chunks = []
    while True:
        out = run_step(s)
        chunks.append((out.num_scheduled_tokens["a"], out.scheduled[0].sample))
        if out.scheduled[0].sample:
            break
    assert chunks == [(8, False), (8, False), (4, True)]


def test_decode_goes_first_and_a_new_prompt_is_chunked_beside_it():
    s = make(budget=8)
    s.add_request(req("a", 4, max_tokens=10))
    run_step(s)
    s.add_request(req("b", 30))
    out = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 7}


def test_max_num_seqs_limits_admission():
    s = make(max_num_seqs=2)
    for rid in "abc":
        s.add_request(req(rid, 2))
    out = run_step(s)
    assert set(out.num_scheduled_tokens) == {"a", "b"}


def test_finish_frees_blocks_and_state_slots():
    s = make(num_blocks=8, slots=2)
    s.add_request(req("a", 5, max_tokens=2))
    run_step(s)
    assert s.block_pool.num_free_blocks == 6 and s.state_pool.num_free_slots == 1
    run_step(s)  # second token: max_tokens reached
    assert not s.has_unfinished_requests()
    assert s.block_pool.num_free_blocks == 8 and s.state_pool.num_free_slots == 2


def test_eos_and_stop_token_ids_finish():
    s = make()
    r = req("a", 3, max_tokens=50)
    s.add_request(r)
    run_step(s, token=2)
    assert r.finish_reason == "stop"
    r2 = req("b", 3, max_tokens=50, stop_token_ids=[9])
    s.add_request(r2)
    run_step(s, token=9)
    assert r2.finish_reason == "stop"
    r3 = req("c", 3, max_tokens=50, ignore_eos=True)
    s.add_request(r3)
    run_step(s, token=2)
    assert not r3.is_finished


def test_abort_frees_at_once():
    s = make(num_blocks=8)
    s.add_request(req("a", 9, max_tokens=50))
    run_step(s)
    s.finish_request("a", "abort")
    assert s.block_pool.num_free_blocks == 8
    assert not s.has_unfinished_requests()
    assert s.schedule().finished_request_ids == ["a"]


def test_preemption_when_pages_run_out_then_recompute():
    s = make(num_blocks=5, block_size=4, budget=64)  # 20 token slots in all
    a, b = req("a", 7, max_tokens=20), req("b", 7, max_tokens=20)
    s.add_request(a)
    s.add_request(b)
    run_step(s)  # each holds 2 blocks (8 slots) after prefill; one stays free for a (admission headroom)
    run_step(s)  # token 8 fits in the second block
    out = run_step(s)  # token 9 takes the free block for a; b has none for its own: b is preempted
    assert list(out.num_scheduled_tokens) == ["a"]
    assert b.num_computed_tokens == 0 and b.block_ids == [] and s.num_preemptions == 1
    assert out.preempted_request_ids == ["b"] and "b" not in out.finished_request_ids
    s.finish_request("a", "abort")
    out = run_step(s)
    # b is recomputed from its prompt plus the tokens it had produced
    assert out.num_scheduled_tokens == {"b": 7 + 2}


def test_admission_leaves_a_page_per_running_request():
    s = make(num_blocks=4, block_size=4, budget=64)
    a, b = req("a", 7, max_tokens=20), req("b", 7, max_tokens=20)
    s.add_request(a)
    s.add_request(b)
    out = run_step(s)  # b's 2 pages would leave none for a's next: b waits instead of being preempted soon
    assert list(out.num_scheduled_tokens) == ["a"] and b.status.name == "WAITING"
    s.finish_request("a", "abort")
    assert run_step(s).num_scheduled_tokens == {"b": 7}


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_preempted_request_waits_until_all_its_tokens_fit(prefix_caching):
    # 64 token slots for 50 + 42 tokens: b is preempted once, then waits for a to finish instead of being
    # readmitted chunk by chunk and preempted again midway through its recomputation (it was 8 times)
    s = make(num_blocks=16, block_size=4, budget=8, prefix_caching=prefix_caching)
    a, b = req("a", 10, max_tokens=40), req("b", 12, max_tokens=30)
    s.add_request(a)
    s.add_request(b)
    while s.has_unfinished_requests():
        run_step(s)
    assert s.num_preemptions == 1
    assert len(a.output_token_ids) == 40 and len(b.output_token_ids) == 30


def test_context_limit_and_empty_prompt():
    s = make(max_len=16)
    with pytest.raises(NinferError, match="context limit is 16"):
        s.add_request(req("a", 16))
    with pytest.raises(NinferError, match="empty"):
        s.add_request(req("b", 0))
    r = req("c", 14, max_tokens=50)
    s.add_request(r)
    run_step(s)
    run_step(s)
    assert r.finish_reason == "length" and r.num_tokens == 16


def test_overloaded_beyond_max_pending():
    s = make(max_num_seqs=1, max_pending=2)
    s.add_request(req("a", 3, max_tokens=1))  # will take the free running slot
    s.add_request(req("b", 3))
    s.add_request(req("c", 3))
    # three wait, one of them for the free slot: the message counts the two past it
    with pytest.raises(EngineOverloaded, match=r"overloaded: 2 requests .*\(max_pending=2\)"):
        s.add_request(req("d", 3))
    assert "d" not in s.requests and len(s.waiting) == 3
    run_step(s)  # a runs and finishes; its running slot is free for b, so c is the only one pending
    s.add_request(req("d", 3))


def test_pending_timeout_expires_waiting_requests_only():
    now = [0.0]
    s = make(max_num_seqs=1, pending_timeout_ms=500)
    s.clock = lambda: now[0]
    for rid in "ab":
        r = req(rid, 3, max_tokens=50)
        r.arrival_time = 0.0
        s.add_request(r)
    run_step(s)  # a runs, b waits
    now[0] = 0.4
    run_step(s)
    assert not s.expired
    now[0] = 0.75
    run_step(s)
    (b,) = s.expired
    assert b.request_id == "b" and b.finish_reason == "expired"
    assert b.error == (
        "inference request expired while waiting for admission after 750 ms; "
        "raise --pending-timeout-ms or lower --max-concurrency"
    )
    assert s.requests.keys() == {"a"}  # the running request is untouched


def test_block_pool_refcounts_prefix_hits_and_lru_eviction():
    pool = BlockPool(num_blocks=4, block_size=2)
    hashes = hash_blocks([5, 6, 7, 8, 9], 2)
    assert len(hashes) == 2 and hashes != hash_blocks([5, 6, 7, 9], 2)
    a = pool.allocate(2)
    pool.register(a[0], hashes[0])
    pool.register(a[1], hashes[1])
    assert pool.lookup(hashes) == a and pool.num_free_blocks == 2
    pool.touch(a)  # a second sequence shares both pages
    pool.free(a)
    assert pool.num_free_blocks == 2  # still referenced by the second
    pool.free(a)
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2  # free, still named
    fresh = pool.allocate(2)
    assert set(fresh).isdisjoint(a)  # never-cached pages go first
    pool.free(fresh)
    pool.allocate(3)  # then the least recently used cached page is evicted: the chain's tail first
    assert pool.lookup(hashes) == [a[0]]


def test_a_prefix_computed_again_names_the_new_page_so_its_chain_survives_the_old_ones_eviction():
    """A page registered for a prefix another page names already (a hybrid model computes pages past its
    last snapshot again) takes the name: the old copy is a plain page, handed out first, and the new
    request's chain stays whole when it is."""
    pool = BlockPool(num_blocks=4, block_size=2)
    h0, h1 = hash_blocks([5, 6, 7, 8], 2)
    old = pool.allocate(1)
    pool.register(old[0], h0)
    pool.free(old)  # unreferenced, still named
    new = pool.allocate(2)  # a second request computed both pages
    pool.register(new[0], h0)
    pool.register(new[1], h1)
    pool.register(new[1], h1)  # (again: no change)
    assert pool.lookup([h0, h1]) == new and pool.block_hash[old[0]] is None
    pool.free(new)
    assert pool.allocate(1) == old  # the plain copy goes first; the chain keeps both pages
    assert pool.lookup([h0, h1]) == new


def test_prefix_hit_skips_cached_pages_and_keeps_one_token_to_compute():
    s = make(num_blocks=16, block_size=4, prefix_caching=True)
    s.add_request(req("a", 12, max_tokens=1))
    run_step(s)  # 12 prompt tokens computed: 3 full pages named
    s.add_request(req("b", 12, max_tokens=1))  # the same prompt
    out = run_step(s)
    assert out.num_scheduled_tokens == {"b": 4} and out.scheduled[0].start_pos == 8
    assert s.block_pool.stats.hits == 8 and s.block_pool.stats.queries == 24


def test_hybrid_prefill_stops_at_the_prompt_snapshot_point():
    s = make(block_size=4, slots=2, snapshots=2, prefix_caching=True)
    s.add_request(req("a", 10, max_tokens=2))
    out = run_step(s)
    # the chunk ends at the last page boundary of the prompt, where the state is snapshotted
    assert out.num_scheduled_tokens == {"a": 8}
    assert out.state_saves == [(s.requests["a"].state_slot, 2)]
    out = run_step(s)
    assert out.num_scheduled_tokens == {"a": 2} and out.scheduled[0].sample
    s.add_request(req("b", 11, max_tokens=1))
    out = run_step(s)
    hit = next(r for r in out.scheduled if r.request_id == "b")
    assert hit.start_pos == 8 and hit.state_restore == 2


def test_hybrid_prefill_snapshots_where_the_second_turn_starts():
    """A new conversation that shares only the system prompt (and tools) with an earlier one: the state was
    snapshotted at the page where the earlier prompt's second turn starts, so the new one resumes there."""
    T = 1  # the turn-start token
    system = [T, *range(10, 32)]  # 23 tokens: the second turn starts at 23, page-aligned 20
    s = make(block_size=4, slots=2, snapshots=4, prefix_caching=True, turn_token_id=T)

    def conversation(rid, user):
        return Request(rid, [*system, T, *user], SamplingParams(max_tokens=1), eos_token_ids=(2,))

    s.add_request(conversation("a", range(40, 50)))
    assert run_step(s).num_scheduled_tokens == {"a": 20}  # the chunk ends at the turn's page
    run_step(s)
    s.add_request(conversation("b", range(60, 75)))
    hit = next(r for r in run_step(s).scheduled if r.request_id == "b")
    assert hit.start_pos == 20 and hit.state_restore >= 0
    # without a turn token (or one turn only) the prompt's end and the intervals are all
    plain = make(block_size=4, slots=2, snapshots=4, prefix_caching=True)
    plain.add_request(conversation("a", range(40, 50)))
    assert run_step(plain).num_scheduled_tokens == {"a": 32}
    one_turn = make(block_size=4, slots=2, snapshots=4, prefix_caching=True, turn_token_id=T)
    one_turn.add_request(Request("c", [T, *range(10, 40)], SamplingParams(max_tokens=1), eos_token_ids=(2,)))
    assert run_step(one_turn).num_scheduled_tokens == {"c": 28}


def test_shared_snapshots_are_evicted_last_while_the_others_keep_two_slots_a_request():
    pool = StatePool(1, 4)  # one running slot: two of the four may be held for shared snapshots

    def save(name: bytes, shared: bool = False) -> None:
        assert pool.new_snapshot(name, shared) is not None or name in pool.snapshots
        pool.end_step()

    save(b"tools", shared=True)
    for name in (b"a1", b"a2", b"a3", b"a4", b"a5"):  # one conversation's own snapshots, oldest first
        save(name)
    assert set(pool.snapshots) == {b"tools", b"a3", b"a4", b"a5"}
    save(b"system", shared=True)  # two shared: both kept
    save(b"a6")
    assert set(pool.snapshots) == {b"tools", b"system", b"a5", b"a6"}
    save(b"edit", shared=True)  # a third: the least recent snapshot goes, shared or not
    save(b"a7")
    assert set(pool.snapshots) == {b"system", b"a6", b"edit", b"a7"}
    # a snapshot the step reads (its restore is copied before the step's saves) goes before a shared one
    small = StatePool(1, 3)
    for name in (b"tools", b"own", b"other"):
        small.new_snapshot(name, shared=name == b"tools")
    small.end_step()
    assert small.find_snapshot(b"own") is not None and small.find_snapshot(b"other") is not None
    assert small.new_snapshot(b"next") is not None and set(small.snapshots) == {b"tools", b"other", b"next"}
    assert small.new_snapshot(b"more") is not None and set(small.snapshots) == {b"tools", b"next", b"more"}
    # where nothing else can go (the others written this step), a shared one does
    assert small.new_snapshot(b"last") is not None and set(small.snapshots) == {b"next", b"more", b"last"}
    small.end_step()
    small.new_snapshot(b"next", shared=True)  # one kept already becomes shared
    small.end_step()
    small.new_snapshot(b"later")
    assert set(small.snapshots) == {b"next", b"last", b"later"}
    # with two slots a running slot and no more, nothing is held for shared snapshots
    plain = StatePool(1, 2)
    plain.new_snapshot(b"tools", shared=True)
    plain.new_snapshot(b"own")
    plain.end_step()
    plain.new_snapshot(b"next")
    assert set(plain.snapshots) == {b"own", b"next"}


def test_a_hint_snapshot_outlives_a_conversations_own_turns():
    """A request's hint (a tool list's end) is snapshotted as shared: the turns of its conversation, each
    adding snapshots of their own (its prompt's end, its last page), do not push it out, so a new
    conversation with the same tools resumes there; and each turn still resumes from the one before."""
    s = make(num_blocks=128, block_size=4, slots=1, snapshots=4, prefix_caching=True)
    tools = list(range(10, 30))  # 20 tokens, a hint at 18 (page 16)
    conversation = [*tools, *range(40, 50)]
    for turn in range(4):
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        s.add_request(Request(f"t{turn}", conversation, params, eos_token_ids=(2,), snapshot_hints=(18,)))
        first = run_step(s).scheduled[0]
        assert turn == 0 or first.start_pos >= len(conversation) - 12, (turn, first.start_pos)
        while s.has_unfinished_requests():
            run_step(s)
        conversation = [*conversation, *[7] * 6, 5, *range(60 + 10 * turn, 66 + 10 * turn)]
    s.add_request(Request("new", [*tools, *range(90, 99)], SamplingParams(max_tokens=1), eos_token_ids=(2,)))
    hit = next(r for r in run_step(s).scheduled if r.request_id == "new")
    assert hit.start_pos == 16 and hit.state_restore >= 0


def test_a_rolling_snapshot_takes_its_own_older_slot_not_the_prompt_ends():
    """Two snapshot slots, one request: while it decodes, each page it completes moves its rolling snapshot
    into the slot the older one had, so its prompt's end stays; the next turn, whose prompt renders the
    reply otherwise (a template that drops the thinking), resumes there."""
    s = make(num_blocks=128, block_size=4, slots=1, snapshots=2, prefix_caching=True)
    conversation = list(range(10, 40))
    for turn in range(3):
        params = SamplingParams(max_tokens=9, ignore_eos=True)
        s.add_request(Request(f"t{turn}", conversation, params, eos_token_ids=(2,)))
        first = run_step(s).scheduled[0]
        assert turn == 0 or first.start_pos == (len(conversation) - 12) // 4 * 4, (turn, first.start_pos)
        while s.has_unfinished_requests():
            run_step(s)
        conversation = [*conversation, 8, 8, 8, *range(60 + 10 * turn, 69 + 10 * turn)]  # a rewritten reply


def test_the_second_turns_snapshot_is_shared_only_in_a_request_without_hints():
    """Where a request has hints (an agent's tool list), they are the shared points: its second turn starts
    past a system prompt that may be per-session. Without any, the second turn's start is shared."""
    T = 1
    prompt = [T, *range(10, 32), T, *range(40, 50)]  # the second turn starts at 23, page-aligned 20
    for hints, shared in (((), [20]), ((9,), [8])):
        s = make(block_size=4, slots=2, snapshots=6, prefix_caching=True, turn_token_id=T)
        s.add_request(
            Request("a", prompt, SamplingParams(max_tokens=1), eos_token_ids=(2,), snapshot_hints=hints)
        )
        while s.has_unfinished_requests():
            run_step(s)
        req = s.requests.get("a") or Request("a", prompt, SamplingParams(), snapshot_hints=hints)
        names = {s._block_hashes(req, p // 4)[-1]: p for p in (8, 20, 32)}
        assert sorted(names[h] for h in s.state_pool._shared) == shared


class _AlwaysDrafts:
    """Proposes `k` copies of token 9 after any history."""

    def __init__(self, k):
        self.k = k

    def propose(self, req, max_tokens):
        return [9] * min(self.k, max_tokens)

    def forget(self, request_id):
        pass


def test_drafts_take_only_spare_pages_and_never_preempt():
    """Drafts get a new page only while a page each other running request stays free, so guesses never
    push a request out; a page the step needs anyway costs nothing extra."""
    s = make(num_blocks=6, block_size=4, budget=32, num_draft_tokens=3, spec="ngram")
    s.proposer = _AlwaysDrafts(3)
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 7, max_tokens=8))
    run_step(s)  # prefill: a holds 2 pages, b 2; 2 free
    out = s.schedule()
    # a's next token is at position 8, a new page its drafts (9..11) share: allowed. b's token is at
    # position 7 (its own page), its drafts at 8..10 need a new page: the last free one, which a keeps
    # in reserve -> refused
    assert {r.request_id: len(r.draft_token_ids) for r in out.scheduled} == {"a": 3, "b": 0}
    assert s.num_preemptions == 0 and s.block_pool.num_free_blocks == 1


class _DraftsFor:
    """Proposes `k` copies of token 9 for the named requests only."""

    def __init__(self, k, names):
        self.k, self.names = k, names

    def propose(self, req, max_tokens):
        return [9] * min(self.k, max_tokens) if req.request_id in self.names else []

    def forget(self, request_id):
        pass


@pytest.mark.parametrize("pad", [False, True])
def test_pad_drafts_gives_a_decode_step_one_query_count(pad):
    """CUDA graphs (pad_drafts): a decode step whose requests would verify different draft counts pads the
    shorter ones with a repeat of their last token, up to what each may still emit; padding stays out of
    the acceptance counters. A step with a prompt chunk is not padded."""
    s = make(budget=64, num_draft_tokens=3, spec="ngram", pad_drafts=pad)
    s.proposer = _DraftsFor(3, {"a"})
    s.add_request(req("a", 5, max_tokens=8))
    s.add_request(req("b", 6, max_tokens=8))
    s.add_request(req("c", 7, max_tokens=3))  # may emit 2 more after the prompt step: 1 draft at most
    run_step(s)
    out = s.schedule()
    counts = {r.request_id: len(r.token_ids) for r in out.scheduled}
    padding = {r.request_id: r.num_padding for r in out.scheduled}
    if pad:
        assert counts == {"a": 4, "b": 4, "c": 2} and padding == {"a": 0, "b": 3, "c": 1}
        b = next(r for r in out.scheduled if r.request_id == "b")
        assert b.draft_token_ids == (7, 7, 7) and b.token_ids == [7, 7, 7, 7]  # its last token, repeated
    else:
        assert counts == {"a": 4, "b": 1, "c": 1} and set(padding.values()) == {0}
    # every draft rejected, and then all accepted: the counters count a's three only
    sampled = {r.request_id: [SampledToken(8, None)] for r in out.scheduled}
    s.update_from_output(out, RunnerOutput(sampled))
    assert (s.num_draft_tokens, s.num_accepted_tokens) == (3, 0)
    out = s.schedule()
    sampled = {r.request_id: [SampledToken(9, None)] * len(r.token_ids) for r in out.scheduled}
    s.update_from_output(out, RunnerOutput(sampled))
    assert (s.num_draft_tokens, s.num_accepted_tokens) == (6, 3)
    # a new prompt beside the decoding requests: a mixed step, not padded
    s.add_request(req("d", 9))
    out = s.schedule()
    assert {r.request_id: r.num_padding for r in out.scheduled} == {"a": 0, "b": 0, "d": 0}


def test_token_slice_equals_slicing_the_whole_history():
    r = req("a", 6)
    r.output_token_ids = [90, 91, 92]
    whole = r.all_token_ids
    for start in range(0, 10):
        for end in range(start, 11):
            assert r.token_slice(start, end) == whole[start:end], (start, end)
