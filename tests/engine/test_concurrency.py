"""Continuous batching on tiny random models: concurrent requests equal solo runs; long prefills do not stall
decode; prefix-cache hits (dense and hybrid) equal cold runs; nothing leaks under random aborts."""

from __future__ import annotations

import itertools
import random
import time

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.errors import NinferError

TIE = 1e-3  # a step whose solo top-2 logprobs are this close is a numerical tie
ARCHS = ["llama", "qwen3", "qwen3_5"]


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 512, (n,), generator=g).tolist()


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request, tmp_path_factory):
    arch = request.param
    return save_tiny(tiny_hf_model(arch, tied=False, seed=7), tmp_path_factory.mktemp(arch))


def assert_same_or_tie(ours: list[int], solo, what: str):
    """Tokens equal the solo run's until a step where the solo run's top two logprobs tie."""
    assert len(ours) == len(solo.token_ids), what
    for step, (tok, ref) in enumerate(zip(ours, solo.token_ids)):
        if tok != ref:
            top2 = sorted(solo.logprobs[step].values(), reverse=True)[:2]
            assert top2[0] - top2[1] < TIE, f"{what}: token {step} is {tok}, solo gave {ref}, no tie"
            return


@pytest.mark.parametrize("prefill_chunk", [2048, 7])
def test_concurrent_requests_equal_solo_runs(model_dir, prefill_chunk):
    lengths = [1, 300, 17, 64, 150, 3, 233, 40]
    max_tokens = [12, 5, 20, 9, 16, 24, 7, 11]
    prompts = [_prompt(n, seed=n) for n in lengths]
    solo_llm = LLM(model_dir, max_concurrency=1, enable_prefix_caching=False)
    solo = [
        solo_llm.generate(
            prompt_token_ids=p,
            sampling_params=SamplingParams(max_tokens=m, temperature=0.0, logprobs=2, ignore_eos=True),
        )[0]
        for p, m in zip(prompts, max_tokens)
    ]
    # all 8 are in flight at once; a 7-token step budget runs at most 7 of them (one token each)
    llm = LLM(model_dir, max_concurrency=min(8, prefill_chunk), prefill_chunk=prefill_chunk)
    ids = [
        llm.add_request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
        for p, m in zip(prompts, max_tokens)
    ]
    outs, max_running = {}, 0
    while llm.has_unfinished_requests():
        for out, _ in llm.step():
            if out.finished:
                outs[out.request_id] = out
        max_running = max(max_running, len(llm.scheduler.running))
    assert max_running >= (4 if prefill_chunk > 8 else 2), "the requests did not run concurrently"
    for rid, ref, n in zip(ids, solo, lengths):
        assert_same_or_tie(outs[rid].token_ids, ref, f"prompt of {n} tokens")


def test_long_prefill_does_not_stall_decode(tmp_path):
    """While a 2,000-token prompt is prefilled in chunks, a running request gets a token every step."""
    path = save_tiny(tiny_hf_model("llama", tied=False, seed=3, max_position_embeddings=4096), tmp_path)
    llm = LLM(path, prefill_chunk=256, max_concurrency=2)
    log = []
    schedule = llm.scheduler.schedule

    def logged_schedule():
        out = schedule()
        log.append({r.request_id: (len(r.token_ids), r.sample) for r in out.scheduled})
        return out

    llm.scheduler.schedule = logged_schedule
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    llm.add_request(_prompt(10, 1), params, request_id="running")
    llm.step()  # its prefill; it is decoding from now on
    llm.add_request(_prompt(2000, 2), params, request_id="long")
    del log[:]
    while llm.scheduler.requests["long"].num_computed_tokens < 2000:
        llm.step()
    prefill_steps = [s for s in log if "long" in s]
    assert len(prefill_steps) >= 8, "the long prompt was not chunked"
    for step in log:
        assert step["running"] == (1, True), f"the running request did not decode in step {step}"
        assert sum(n for n, _ in step.values()) <= 256


def test_prefix_cache_dense_hit_equals_cold_run(tmp_path):
    path = save_tiny(tiny_hf_model("qwen3", tied=False, seed=5), tmp_path)
    prefix = _prompt(200, 11)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    warm = LLM(path)
    first = warm.generate(prompt_token_ids=prefix + _prompt(9, 12), sampling_params=params)[0]
    assert first.num_cached_tokens == 0
    second_prompt = prefix + _prompt(30, 13)
    second = warm.generate(prompt_token_ids=second_prompt, sampling_params=params)[0]
    assert second.num_cached_tokens >= 192
    cold = LLM(path, enable_prefix_caching=False).generate(
        prompt_token_ids=second_prompt, sampling_params=params
    )[0]
    assert cold.num_cached_tokens == 0
    assert second.token_ids == cold.token_ids
    stats = warm.scheduler.block_pool.stats
    assert stats.hits == second.num_cached_tokens and stats.queries == len(first.prompt_token_ids) + len(
        second_prompt
    )


def test_prefix_cache_hybrid_multi_turn_conversation(tmp_path):
    """A growing 5-turn conversation on the hybrid model: every turn reuses at least the previous prompt
    (rounded down to a page) through KV pages plus a recurrent-state snapshot, with cold-run outputs."""
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=9), tmp_path)
    warm, cold = LLM(path), LLM(path, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt, prev_len = _prompt(37, 20), 0
    for turn in range(5):
        out = warm.generate(prompt_token_ids=prompt, sampling_params=params)[0]
        ref = cold.generate(prompt_token_ids=prompt, sampling_params=params)[0]
        assert out.token_ids == ref.token_ids, f"turn {turn}"
        if turn:
            assert out.num_cached_tokens >= prev_len // 16 * 16, f"turn {turn}"
        prev_len = len(prompt)
        prompt = prompt + out.token_ids + _prompt(23 + turn, 30 + turn)  # the next user message


def test_prefix_cache_hybrid_needs_a_snapshot(tmp_path):
    """Without state snapshots a hybrid model never takes a KV-only prefix hit (it would be wrong)."""
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=9), tmp_path)
    llm = LLM(path, state_snapshots=0)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = _prompt(100, 40)
    llm.generate(prompt_token_ids=prompt, sampling_params=params)
    again = llm.generate(prompt_token_ids=prompt + [5, 6, 7], sampling_params=params)[0]
    assert again.num_cached_tokens == 0
    assert llm.scheduler.block_pool.num_cached_blocks > 0  # the pages are cached, the state is not


def test_a_hybrid_resumes_after_the_system_prompt_and_before_the_last_message(tmp_path, default_tokenizer):
    """A hybrid model snapshots its state where a prompt's second turn starts and where the turn before its
    last one starts (ChatML's <|im_start|>, at or before the page): a new conversation with the same system
    prompt resumes after it, a conversation whose last message was edited resumes before that message (hits
    short of the 4096-token interval), and each replies as an engine that computed it all."""
    from conftest import save_thinking_mtp_model

    path = save_thinking_mtp_model(tmp_path, default_tokenizer, think=False)
    turn = default_tokenizer.token_to_id("<|im_start|>")
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    llm = LLM(path, block_size=16)
    history = [
        system,
        {"role": "user", "content": "Name three rivers and the seas they reach. " * 4},
        {"role": "assistant", "content": "The Rhine, the Danube and the Volga, which reach three seas. " * 3},
    ]
    llm.chat([*history, {"role": "user", "content": "Which is the longest of them? " * 3}], params)
    for conversation, boundary in (
        ([system, {"role": "user", "content": "Count to five, slowly."}], 1),  # the second turn
        ([*history, {"role": "user", "content": "And the shortest, in a word?"}], -2),  # the last user turn
    ):
        out = llm.chat(conversation, params)
        starts = [i for i, t in enumerate(out.prompt_token_ids) if t == turn]
        assert starts[boundary] > 48 and out.num_cached_tokens == starts[boundary] // 16 * 16
        assert out.token_ids == LLM(path, block_size=16).chat(conversation, params).token_ids


def test_a_hybrid_resumes_at_a_snapshot_hint(tmp_path):
    """A request's snapshot hints (its client's cache breakpoints) are snapshot points too, at or before
    their page: a prompt that shares the prefix up to one resumes there, where no interval or turn point
    is (without the hint it computes all of it), and replies as an engine that computed it all."""
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=1), tmp_path)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    rng = random.Random(3)
    head = [rng.randrange(1, 500) for _ in range(75)]
    first, second = (head + [rng.randrange(1, 500) for _ in range(n)] for n in (40, 30))
    cold = LLM(path, block_size=16).generate(prompt_token_ids=second, sampling_params=params)[0]
    for hints, cached in (((), 0), ((75,), 64), ((75, 100), 64)):
        llm = LLM(path, block_size=16)
        llm.add_request(first, params, snapshot_hints=hints)
        while llm.has_unfinished_requests():
            llm.step()
        out = llm.generate(prompt_token_ids=second, sampling_params=params)[0]
        assert out.num_cached_tokens == cached and out.token_ids == cold.token_ids, hints


def test_snapshot_hints_outside_the_prompt_are_refused(tmp_path):
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=1), tmp_path)
    llm = LLM(path, block_size=16)
    with pytest.raises(NinferError, match=r"snapshot hint 9 is outside the prompt \(0..8\)"):
        llm.add_request(list(range(1, 9)), SamplingParams(max_tokens=2), snapshot_hints=(4, 9))
    assert not llm.has_unfinished_requests()


class _RandomDrafts:
    """Up to `k` random draft tokens after any history: mostly rejected, now and then accepted."""

    def __init__(self, k: int, vocab: int = 512):
        self.k, self.vocab, self.rng = k, vocab, random.Random(7)

    def propose(self, req, max_tokens):
        return [self.rng.randrange(self.vocab) for _ in range(min(self.rng.randint(0, self.k), max_tokens))]

    def forget(self, request_id):
        pass


@pytest.mark.parametrize("spec", ["none", "ngram"])
@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_no_leaks_under_random_aborts(tmp_path, arch, spec):
    """200 random requests, 30% aborted mid-stream, tight KV (preemptions): all pages and slots come back;
    with draft tokens too (random ones: state backups and restores, draft pages, stops inside a run)."""
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=1), tmp_path)
    llm = LLM(path, max_concurrency=4, kv_capacity=256, prefill_chunk=64, state_snapshots=3, spec=spec)
    if spec != "none":
        llm.scheduler.proposer = _RandomDrafts(3)
    pool, states = llm.scheduler.block_pool, llm.scheduler.state_pool
    free_blocks = pool.num_free_blocks
    free_slots = states.num_free_slots if states else None
    rng = random.Random(0)
    shared = _prompt(48, 99)
    pending = list(range(200))
    abort_after: dict[str, int] = {}
    got: dict[str, int] = {}
    while pending or llm.has_unfinished_requests():
        while pending and len(llm.scheduler.waiting) < 3:
            i = pending.pop()
            n = rng.randint(1, 80)
            prompt = (
                shared[: rng.randint(0, 48)] + _prompt(n, 1000 + i) if rng.random() < 0.4 else _prompt(n, i)
            )
            params = SamplingParams(
                max_tokens=rng.randint(1, 24),
                temperature=rng.choice([0.0, 0.7, 1.3]),
                top_p=rng.choice([1.0, 0.9]),
                top_k=rng.choice([0, 20]),
                repetition_penalty=rng.choice([1.0, 1.2]),
                seed=rng.choice([None, i]),
                logprobs=rng.choice([None, 3]),
            )
            rid = llm.add_request(prompt, params)
            if rng.random() < 0.3:
                abort_after[rid] = rng.randint(0, params.max_tokens - 1)
        for out, _ in llm.step():
            got[out.request_id] = len(out.token_ids)
        for rid, after in list(abort_after.items()):
            if got.get(rid, -1) >= after:
                llm.abort(rid)
                del abort_after[rid]
    llm.step()  # an idle step hands the last finished ids to the runner, which drops their state
    assert pending == [] and not llm.scheduler.requests and not llm._streams
    assert pool.num_free_blocks == free_blocks
    assert all(c == 0 for c in pool.ref_cnt)
    if states:
        assert states.num_free_slots == free_slots
    assert llm.runner.sampler.num_live_seeds == 0
    assert llm.scheduler.num_preemptions > 0, "the KV pool was meant to run short"
    if spec != "none":  # (how many random drafts are accepted depends on the unseeded requests' draws)
        assert llm.scheduler.num_draft_tokens > llm.scheduler.num_accepted_tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_drafts_under_preemption_keep_greedy_output(tmp_path, arch):
    """A KV pool too small for every request at once preempts and recomputes; with draft tokens verified
    all along (the right continuation, every 3rd draft wrong: accepted and rejected runs alike), every
    request still gets the plain engine's greedy tokens, and every page and state slot comes back."""
    from test_spec_decode import ScriptedDrafts

    path = save_tiny(tiny_hf_model(arch, tied=False, seed=2), tmp_path)
    prompts = [_prompt(30 + 7 * i, 50 + i) for i in range(5)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    want = LLM(path, max_concurrency=5).generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(path, max_concurrency=5, kv_capacity=128, prefill_chunk=32, spec="ngram")
    full = {f"req-{i}": p + w.token_ids for i, (p, w) in enumerate(zip(prompts, want))}
    llm.scheduler.proposer = ScriptedDrafts(full, 3, 3)
    pool, states = llm.scheduler.block_pool, llm.scheduler.state_pool
    free_blocks, free_slots = pool.num_free_blocks, states.num_free_slots if states else None
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert llm.scheduler.num_preemptions > 0
    assert 0 < llm.scheduler.num_accepted_tokens < llm.scheduler.num_draft_tokens
    assert pool.num_free_blocks == free_blocks and (states is None or states.num_free_slots == free_slots)


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_seeded_sampling_draws_on_after_a_preemption(tmp_path, arch):
    """A preempted request recomputes its KV, not its draws: seeded sampled tokens (Mirostat's surprise
    target too) are the ones a pool with room for every request gives."""
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=3), tmp_path)
    prompts = [_prompt(30 + 7 * i, 60 + i) for i in range(5)]
    params = [SamplingParams(max_tokens=20, temperature=1.0, seed=i, ignore_eos=True) for i in range(4)]
    params.append(SamplingParams(max_tokens=20, temperature=1.0, seed=9, mirostat=2, ignore_eos=True))
    roomy = LLM(path, max_concurrency=5, prefill_chunk=32)
    want = roomy.generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(path, max_concurrency=5, kv_capacity=128, prefill_chunk=32)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert llm.scheduler.num_preemptions > 0
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    llm.step()  # an idle step hands the last finished ids to the runner
    assert llm.runner.sampler.num_live_seeds == 0


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_choices_after_a_twin_start_from_its_prompt_in_the_cache(tmp_path, arch):
    """n > 1 choices: the others wait while the first runs the shared prompt, then take its pages (and a
    hybrid model's state snapshot) from the prefix cache; each samples as it would alone."""
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=4), tmp_path)
    prompt = _prompt(45, 7)
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    alone = [LLM(path).generate(prompt_token_ids=prompt, sampling_params=p)[0].token_ids for p in params]
    llm = LLM(path, max_concurrency=3, prefill_chunk=64)  # room for a second prompt in the first step
    first = llm.add_request(prompt, params[0])
    others = [llm.add_request(prompt, p, after=first) for p in params[1:]]
    outs = {}
    while llm.has_unfinished_requests():
        outs.update({o.request_id: o for o, _ in llm.step() if o.finished})
    assert [outs[r].token_ids for r in (first, *others)] == alone
    assert outs[first].num_cached_tokens == 0
    assert all(outs[r].num_cached_tokens == 32 for r in others)  # the prompt's full pages, computed once
    assert llm.scheduler.block_pool.num_free_blocks == llm.scheduler.block_pool.num_blocks


def test_a_choice_waiting_for_its_twin_does_not_expire_meanwhile(tmp_path):
    path = save_tiny(tiny_hf_model("llama", tied=False, seed=4), tmp_path)
    llm = LLM(path, max_concurrency=2, prefill_chunk=16, pending_timeout_ms=2500)
    ticks, base = itertools.count(), time.monotonic()  # (requests take their arrival time from it)
    llm.scheduler.clock = lambda: base + next(ticks)  # a second passes at each look at the clock
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    first = llm.add_request(_prompt(60, 8), params)
    llm.step()  # the first is admitted at once (so never expires); its prompt takes four steps
    second = llm.add_request(_prompt(60, 8), params, after=first)
    outs = {}
    while llm.has_unfinished_requests():
        outs.update({o.request_id: o for o, _ in llm.step() if o.finished})
    assert outs[second].finish_reason == "length" and outs[second].token_ids == outs[first].token_ids


def test_queue_time_is_the_wait_for_admission(model_dir):
    """One request at a time: the second waits the whole of the first's run in the queue, which its output
    says (RequestOutput.queue_time, the /metrics queue histograms' source); the first waited for nothing."""
    llm = LLM(model_dir, max_concurrency=1)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    started = time.monotonic()
    first, second = llm.generate(prompt_token_ids=[_prompt(20, 1), _prompt(20, 2)], sampling_params=params)
    total = time.monotonic() - started
    assert 0 <= first.queue_time < second.queue_time <= total
