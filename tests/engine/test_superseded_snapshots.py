"""A conversation's state snapshots superseded by its next turn's (engine/cache/state_pool.py): a request
that resumes from an earlier request's snapshot past the conversation's head and saves its own prompt's end
sends the earlier one's snapshots to the front of the eviction order, in both tiers; the host tier keeps a
superseded one only in a free slot or another superseded one's. So a subagent's many turns evict their own
older snapshots, not the last one of the agent waiting for it."""

from __future__ import annotations

import pytest
from conftest import random_prompt, same_output, save_tiny, tiny_hf_model
from test_scheduler import make

from engine import LLM, SamplingParams
from engine.cache.host_pool import HostPool
from engine.cache.state_pool import StatePool
from engine.request import Request
from engine.scheduler.output import RunnerOutput, SampledToken

GEN = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3_5", tied=False), tmp_path_factory.mktemp("hybrid"))


def _saved(pool: StatePool, name: bytes, owner: tuple[str, int] | None = None, shared: bool = False) -> None:
    assert pool.new_snapshot(name, shared, owner=owner) is not None
    pool.end_step()


def test_superseded_snapshots_are_evicted_first_and_kept_in_host_memory_only_where_room_is():
    pool = StatePool(1, 3, host_slots=2)
    _saved(pool, b"b1", ("b", 32))  # another conversation's, least recently used
    _saved(pool, b"a1", ("a", 16))
    _saved(pool, b"a2", ("a", 32))
    pool.supersede("a", after=0)
    _saved(pool, b"c1", ("c", 32))  # a1 goes (b1 would, by LRU alone): into a free host slot
    _saved(pool, b"c2", ("c", 48))  # then a2: the other free one
    assert set(pool.snapshots) == {b"b1", b"c1", b"c2"}
    assert set(pool.host.slots) == {b"a1", b"a2"} == pool.host.superseded
    _saved(pool, b"c3", ("c", 64))  # b1 (live) takes a superseded host slot
    assert set(pool.host.slots) == {b"a2", b"b1"} and pool.host.superseded == {b"a2"}
    pool.supersede("c", after=0)
    _saved(pool, b"d1", ("d", 16))  # c1, superseded, takes a2's (superseded) slot
    assert set(pool.host.slots) == {b"b1", b"c1"} and pool.host.superseded == {b"c1"}
    pool.host.discard(b"c1")
    _saved(pool, b"d2", ("d", 32))  # c2 into the free slot
    _saved(pool, b"d3", ("d", 48))  # c3 takes c2's slot: of the superseded ones, the older goes
    assert set(pool.host.slots) == {b"b1", b"c3"} and pool.owner_of(b"b1") == ("b", 32)
    # a host tier holding only live snapshots keeps no superseded one
    one = StatePool(1, 1, host_slots=1)
    _saved(one, b"x", ("a", 16))
    _saved(one, b"y", ("b", 16))  # x into the host tier
    one.supersede("b", after=0)
    _saved(one, b"z", ("c", 16))
    assert set(one.host.slots) == {b"x"} and one.owner_of(b"y") is None and one.drain_swaps()[0] == [(1, 0)]


def test_only_snapshots_past_the_head_are_superseded_and_a_resumed_one_is_live_again():
    pool = StatePool(1, 4, host_slots=2)
    _saved(pool, b"head", ("a", 16))
    _saved(pool, b"hint", ("a", 32), shared=True)
    _saved(pool, b"end", ("a", 48))
    pool.supersede("a", after=16, keep_shared=True)  # turns not known: the shared ones kept
    assert pool._superseded == {b"end"} and pool.owner_of(b"hint") == ("a", 32)
    pool.supersede("a", after=16)
    assert pool._superseded == {b"end", b"hint"} and not pool.is_shared(b"hint")
    assert pool.owner_of(b"head") == ("a", 16) and pool.owner_of(b"end") is None
    assert pool.find_snapshot(b"end") is not None and pool._superseded == {b"hint"}  # resumed from again
    pool.end_step()
    # in the host tier: a superseded snapshot taken back is live there too
    host = HostPool(2)
    host.put(b"x", superseded=True)
    host.take(b"x")
    assert host.superseded == set()


def test_host_pool_without_superseded_prefixes_is_plain_lru():
    host = HostPool(2)
    host.put(b"a"), host.put(b"b")
    assert host.put(b"c") is not None and set(host.slots) == {b"b", b"c"}
    assert host.put(b"d", superseded=True) is None and set(host.slots) == {b"b", b"c"}


def _turn(s, rid: str, prompt: list[int]) -> int:
    """Run one request alone to its end (token 7 sampled each step): where its first chunk starts."""
    s.add_request(Request(rid, prompt, SamplingParams(max_tokens=3), eos_token_ids=(2,)))
    start = None
    while s.has_unfinished_requests():
        out = s.schedule()
        for r in out.scheduled:
            start = r.start_pos if start is None else start
        sampled = {r.request_id: [SampledToken(7, None)] for r in out.scheduled if r.sample}
        s.update_from_output(out, RunnerOutput(sampled))
    return start


def test_a_later_turn_supersedes_the_turn_before_and_a_new_conversation_on_the_head_does_not():
    T = 1  # the turn-start token
    head = [T, *range(10, 30), T, *range(30, 45)]  # the system turn and the first message: 37 tokens
    s = make(block_size=4, slots=1, snapshots=8, prefix_caching=True, turn_token_id=T)
    pool = s.state_pool
    first = head + [T, *range(50, 60)]  # its third turn starts at 37: saved at 20 (the second's, shared), 48
    _turn(s, "a1", first)
    owned = {h: at for h, (o, at) in pool._owner.items() if o == "a1"}
    assert sorted(owned.values()) == [20, 48] and not pool._superseded
    # another conversation on the same head (a document asked about again) resumes inside the head
    assert _turn(s, "b1", head + [T, *range(200, 230)]) == 20 and not pool._superseded
    # a1's next turn resumes at a1's prompt end (past the head): a1's snapshot there goes first now
    assert _turn(s, "a2", first + [7, 7, 7, T, *range(60, 80)]) == 48
    assert {h for h, at in owned.items() if at == 48} == pool._superseded
    assert [at for o, at in pool._owner.values() if o == "a1"] == [20]


def _agent_and_subagent(llm: LLM, sub_turns: int) -> list[tuple[int, int, list[int]]]:
    """An agent's two turns, its subagent's `sub_turns` turns, the agent's third turn, all after the same
    tool list (a hint), each turn's reply rendered otherwise than generated (it resumes at most where the
    turn before's prompt ended): per turn (prompt length, cached tokens, output)."""
    tools = random_prompt(40, 7)
    convs = {"agent": tools + random_prompt(50, 1), "sub": tools + random_prompt(30, 2)}
    rows = []
    for turn, who in enumerate(["agent"] * 2 + ["sub"] * sub_turns + ["agent"]):
        prompt = convs[who]
        llm.add_request(prompt, GEN, snapshot_hints=(40,))
        out = None
        while llm.has_unfinished_requests():
            out = next((o for o, _ in llm.step() if o.finished), out)
        rows.append((prompt, out.num_cached_tokens, out))
        convs[who] = prompt + [t + 1 for t in out.token_ids] + random_prompt(20, 100 + turn)
    return rows


def test_the_agent_resumes_where_it_left_off_after_its_subagents_many_turns(hybrid, monkeypatch):
    """Four GPU slots and eight host ones at one request: the subagent's ten turns save more snapshots
    (its prompts' ends, its replies' last pages) than both tiers hold; its older ones are superseded and go
    first, so the agent's third turn resumes at its second prompt's end. Plain LRU order (superseding off)
    evicts the agent's and resumes it at the tool list. Outputs equal a cold engine's."""
    small = dict(kv_capacity=2048, max_context=1024, max_concurrency=1, host_state_snapshots=8)
    rows = _agent_and_subagent(LLM(hybrid, **small), 10)
    (before, _, _), (last, cached, out) = rows[1], rows[-1]
    assert cached == len(before) // 16 * 16
    monkeypatch.setattr(StatePool, "supersede", lambda self, owner, after, keep_shared=False: None)
    lru = _agent_and_subagent(LLM(hybrid, **small), 10)
    assert lru[-1][1] == 32  # the tool list's page-aligned end
    assert [p for p, _, _ in rows] == [p for p, _, _ in lru]
    assert all(same_output(a, b) for (_, _, a), (_, _, b) in zip(rows, lru))
    cold = LLM(hybrid, max_context=1024, enable_prefix_caching=False)
    assert same_output(out, cold.generate(prompt_token_ids=last, sampling_params=GEN)[0])
