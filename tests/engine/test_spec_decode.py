"""Speculative decoding: n-gram drafts, their verification, and output unchanged by them.

Drafts from a scripted proposer (the reference continuation with chosen tokens wrong) exercise every
verification path on dense and hybrid models: all accepted, a rejection at each position, a stop or the
token limit inside the accepted run, penalties that depend on the drafts before them.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.request import Request
from engine.sample.sampler import Sampler
from engine.spec.ngram import NgramProposer

PROMPTS = [[5, 9, 200, 31, 77, 5, 9, 200, 31, 77, 5, 9], list(range(40, 75))]


class ScriptedDrafts:
    """Proposes the reference continuation of each request, with every `wrong_every`-th draft altered."""

    def __init__(self, continuations: dict[str, list[int]], wrong_every: int, num_draft_tokens: int):
        self.continuations, self.wrong_every = continuations, wrong_every
        self.num_draft_tokens = num_draft_tokens
        self.proposed = 0

    def forget(self, request_id: str) -> None:
        pass

    def propose(self, req: Request, max_tokens: int) -> list[int]:
        ref, n = self.continuations[req.request_id], req.num_tokens
        drafts = list(ref[n : n + min(self.num_draft_tokens, max_tokens)])
        for i in range(len(drafts)):
            self.proposed += 1
            if self.proposed % self.wrong_every == 0:
                drafts[i] = (drafts[i] + 1) % 500
        return drafts


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def model_dir(request, tmp_path_factory):
    return save_tiny(tiny_hf_model(request.param, tied=False), tmp_path_factory.mktemp(request.param))


def _generate(llm: LLM, params: SamplingParams, prompts=PROMPTS):
    return llm.generate(prompt_token_ids=prompts, sampling_params=params)


def _with_drafts(model_dir, reference, wrong_every: int, prompts=PROMPTS, **options) -> LLM:
    llm = LLM(model_dir, spec="ngram", **{"draft_tokens": 4, **options})
    full = {f"req-{i}": p + r.token_ids for i, (p, r) in enumerate(zip(prompts, reference))}
    llm.scheduler.proposer = ScriptedDrafts(full, wrong_every, llm.engine_config.draft_tokens)
    return llm


@pytest.mark.parametrize("wrong_every", [1, 3, 1000])
def test_greedy_output_and_logprobs_unchanged_by_drafts(model_dir, wrong_every):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2)
    reference = _generate(LLM(model_dir), params)
    llm = _with_drafts(model_dir, reference, wrong_every)
    got = _generate(llm, params)
    for ref, out in zip(reference, got):
        assert out.token_ids == ref.token_ids
        for a, b in zip(ref.logprobs, out.logprobs):
            assert a.keys() == b.keys()
            assert all(math.isclose(a[t], b[t], abs_tol=1e-4) for t in a)
    drafted, accepted = llm.scheduler.num_draft_tokens, llm.scheduler.num_accepted_tokens
    assert drafted > 0
    if wrong_every == 1:
        assert accepted == 0
    elif wrong_every == 1000:
        assert accepted == drafted  # every draft right: 5 tokens per step
        assert sum(o.num_accepted_tokens for o in got) == accepted
    else:
        assert 0 < accepted < drafted
    # everything freed, state slots and backups included
    pool = llm.scheduler.block_pool
    assert pool.num_free_blocks == pool.num_blocks and not llm.has_unfinished_requests()


def test_penalties_count_the_drafts_before_each_position(model_dir):
    params = SamplingParams(
        temperature=0.0, max_tokens=24, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5
    )
    reference = _generate(LLM(model_dir), params)
    got = _generate(_with_drafts(model_dir, reference, 4), params)
    assert [o.token_ids for o in got] == [r.token_ids for r in reference]


def test_stop_token_and_token_limit_inside_an_accepted_run(model_dir):
    plain = _generate(LLM(model_dir), SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    stop = plain[0].token_ids[9]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop]),
        SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
    ):
        reference = _generate(LLM(model_dir), params)
        llm = _with_drafts(model_dir, plain, 1000)
        got = _generate(llm, params)
        for ref, out in zip(reference, got):
            assert (out.token_ids, out.finish_reason) == (ref.token_ids, ref.finish_reason)


@pytest.mark.parametrize("wrong_every", [3, 1000])
def test_min_tokens_bans_the_stop_token_in_draft_rows_too(model_dir, wrong_every):
    """Drafts of the unbanned continuation hold the stop token before min_tokens: rejected at that row."""
    plain = _generate(LLM(model_dir), SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    stop = plain[0].token_ids[3]
    params = SamplingParams(
        temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop], min_tokens=10
    )
    reference = _generate(LLM(model_dir), params)
    assert len(reference[0].token_ids) >= 10 and stop not in reference[0].token_ids[:10]
    llm = _with_drafts(model_dir, plain, wrong_every)
    got = _generate(llm, params)
    for ref, out in zip(reference, got):
        assert (out.token_ids, out.finish_reason) == (ref.token_ids, ref.finish_reason)
    assert llm.scheduler.num_accepted_tokens > 0


def test_ngram_drafts_on_a_repeating_prompt_keep_greedy_output(model_dir):
    prompt = [[7, 8, 9, 10, 11] * 6 + [7, 8]]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    reference = _generate(LLM(model_dir), params, prompt)
    llm = LLM(model_dir, spec="ngram", draft_tokens=3)
    assert _generate(llm, params, prompt)[0].token_ids == reference[0].token_ids
    # (whether a random tiny model repeats itself enough to draft is chance: tests/e2e/test_spec_ngram.py
    # drafts on a real model)


def test_padded_drafts_keep_greedy_output_and_one_query_count(model_dir):
    """pad_drafts (on with CUDA graphs; forced here): only the first request gets drafts, so every decode
    step pads the second one's to the same count. Greedy output is unchanged, dense and hybrid (whose
    state goes back on a rejected padding draft), and every decode step has one query count."""
    from dataclasses import replace

    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    reference = _generate(LLM(model_dir), params)
    llm = _with_drafts(model_dir, reference, 3)
    llm.scheduler.config = replace(llm.scheduler.config, pad_drafts=True)
    real = llm.scheduler.proposer
    llm.scheduler.proposer.propose = lambda req, most: (
        real.__class__.propose(real, req, most) if req.request_id == "req-0" else []
    )
    steps = []
    schedule = llm.scheduler.schedule
    llm.scheduler.schedule = lambda: steps.append(schedule()) or steps[-1]
    got = _generate(llm, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]
    padded = [s for s in steps if any(r.num_padding for r in s.scheduled)]
    assert padded and all(len({len(r.token_ids) for r in s.scheduled}) == 1 for s in padded)
    assert all(r.request_id == "req-1" for s in padded for r in s.scheduled if r.num_padding)
    assert llm.scheduler.num_accepted_tokens <= llm.scheduler.num_draft_tokens == real.proposed


@pytest.mark.parametrize("wrong_every", [1, 3, 1000])
def test_seeded_sampling_draws_the_same_tokens_with_drafts_as_without(model_dir, wrong_every):
    """A sampled row accepts its draft when its own draw is the draft: right drafts, wrong ones and none
    emit the same seeded tokens (each request's draw a position is keyed by its seed and that position)."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, ignore_eos=True, seed=11),
        SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=-5, xtc_probability=0.5),
    ]
    reference = _generate(LLM(model_dir), params)
    llm = _with_drafts(model_dir, reference, wrong_every)
    assert [o.token_ids for o in _generate(llm, params)] == [o.token_ids for o in reference]
    drafted, accepted = llm.scheduler.num_draft_tokens, llm.scheduler.num_accepted_tokens
    assert drafted > 0 and (accepted == 0 if wrong_every == 1 else accepted > 0)
    if wrong_every == 1000:
        assert accepted == drafted


def test_rejection_sampling_keeps_the_target_distribution():
    """The first emitted token after verifying a draft is distributed as p, whatever the draft."""
    torch.manual_seed(0)
    vocab, n = 6, 6000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5])
    p = torch.softmax(logits / 0.7, -1)
    sampler = Sampler()
    for draft in (0, 4):  # a likely draft and an unlikely one
        params = [SamplingParams(temperature=0.7, seed=draft * n + i) for i in range(n)]
        ids = [f"r{draft}-{i}" for i in range(n)]
        out = sampler(logits.expand(n, vocab).clone(), ids, params, None, [draft] * n)
        first = torch.tensor([t.token_id for t in out])
        freq = torch.bincount(first, minlength=vocab).float() / n
        assert (freq - p).abs().max() < 0.03, (draft, freq, p)
        accepted = sum(t.accepted for t in out) / n
        assert abs(accepted - p[draft].item()) < 0.03
        assert all(t.token_id == draft for t in out if t.accepted)


def test_greedy_verification_accepts_exactly_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    params = [SamplingParams(temperature=0.0)] * 3
    out = Sampler()(logits, ["a", "a", "a"], params, None, [1, 2, -1])
    assert [(t.token_id, t.accepted) for t in out] == [(1, True), (0, False), (2, False)]


def _req(rid: str, tokens: list[int], prompt: int = 3) -> Request:
    """A request holding `tokens`, the first `prompt` of them as its prompt, the rest as its output."""
    return Request(rid, tokens[:prompt], SamplingParams(), output_token_ids=list(tokens[prompt:]))


def test_ngram_proposer_takes_the_latest_longest_match():
    prop = NgramProposer(3, max_ngram=3, min_ngram=2)
    # "1 2" occurs twice before the end; the latest is followed by 9 8 7, and "5 1 2" is longer still
    tokens = [5, 1, 2, 3, 4, 0, 1, 2, 9, 8, 7, 5, 1, 2]
    assert prop.propose(_req("a", tokens), 3) == [3, 4, 0]
    assert prop.propose(_req("b", tokens[:-3] + [6, 1, 2]), 3) == [9, 8, 7]
    assert prop.propose(_req("b", tokens[:-3] + [6, 1, 2]), 2) == [9, 8]
    assert prop.propose(_req("c", [1, 2, 3, 4]), 3) == []  # nothing repeats
    assert prop.propose(_req("d", [4, 4, 4, 4]), 3) == [4]  # the match ends just before the suffix
    # the history grows in place; a shorter one (tokens taken back) starts again
    grown = [1, 2, 3, 1, 2]
    assert prop.propose(_req("e", grown), 3) == [3, 1, 2]
    assert prop.propose(_req("e", grown + [3, 7, 1, 2]), 3) == [3, 7, 1]
    assert prop.propose(_req("e", [8, 9, 8]), 3) == []


def test_no_drafts_beyond_the_tokens_a_request_may_still_emit(model_dir):
    llm = LLM(model_dir, spec="ngram", draft_tokens=8)
    req = Request("x", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(max_tokens=3))
    req.output_token_ids = [3, 1]
    req.num_computed_tokens = req.num_tokens - 1
    assert llm.scheduler._drafts(req, 1, room=100) == ([], False)  # one token left: it is the bonus token
    req.sampling_params = SamplingParams(max_tokens=5)
    assert llm.scheduler._drafts(req, 1, room=100) == ([2, 3], False)  # three left: two drafts + the bonus
    assert llm.scheduler._drafts(req, 1, room=1) == ([2], False)  # the step budget
    req.num_computed_tokens = 0
    assert llm.scheduler._drafts(req, 1, room=100) == ([], False)  # the step does not reach the end
    req.num_computed_tokens = req.num_tokens - 1
    llm.scheduler.config = dataclasses.replace(llm.scheduler.config, max_context=req.num_tokens + 2)
    assert llm.scheduler._drafts(req, 1, room=100) == ([2], False)  # the context limit
    # a prediction the output follows drafts first, within the same limits
    req.sampling_params = SamplingParams(max_tokens=5, prediction=[3, 1, 7, 7, 7])
    assert llm.scheduler._drafts(req, 1, room=100) == ([7], True)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(spec="eagle"), "use one of none, ngram, mtp"),
        (dict(spec="ngram", draft_tokens=0), "draft_tokens must be between 1 and 16"),
    ],
)
def test_bad_spec_options_are_refused(options, message):
    from engine.config import EngineConfig

    with pytest.raises(NinferError, match=message):
        EngineConfig(model="", **options)


def test_triton_path_verifies_drafts_in_the_decode_kernel(model_dir, kernel_backend, monkeypatch):
    """With the Triton kernels forced (under the interpreter on CPU, compiled on a GPU), a verification
    step's k + 1 query tokens per sequence go through the split-K decode kernel, and the output is still
    plain decoding's."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    where = dict(device="cuda" if torch.cuda.is_available() else "cpu", dtype="float32")
    kernel_backend("naive")
    reference = _generate(LLM(model_dir, **where), params, PROMPTS[:1])
    kernel_backend("triton")
    import ninfer_kernels as kernels

    attention = kernels._triton("paged_attention")
    decode, counts = attention.paged_attention_decode, []

    def spy(q, cache, block_table, seq_lens, scale, q_per_seq=1, **kw):
        counts.append(q_per_seq)
        return decode(q, cache, block_table, seq_lens, scale, q_per_seq, **kw)

    monkeypatch.setattr(attention, "paged_attention_decode", spy)
    llm = _with_drafts(model_dir, reference, 3, PROMPTS[:1], draft_tokens=3, **where)
    assert _generate(llm, params, PROMPTS[:1])[0].token_ids == reference[0].token_ids
    assert 4 in counts  # the last known token + 3 drafts


@pytest.mark.gpu
def test_drafts_on_cuda_between_graph_steps_keep_greedy_output(model_dir):
    """On a GPU, decode and verification steps replay CUDA graphs (the decode kernel verifying k + 1 tokens a
    sequence; a hybrid model's state backups copied outside the graph), mixed steps run eagerly; the output
    is plain decoding's."""
    options = dict(device="cuda", dtype="float32", max_concurrency=2)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    reference = _generate(LLM(model_dir, **options), params)
    llm = _with_drafts(model_dir, reference, 3, **options)
    assert llm.runner.graphs is not None and (2, 5) in llm.runner.graphs.graphs  # 2 requests x (1 + 4 drafts)
    got = _generate(llm, params)
    assert [o.token_ids for o in got] == [r.token_ids for r in reference]
    assert 0 < llm.scheduler.num_accepted_tokens < llm.scheduler.num_draft_tokens


class _EchoDrafts:
    """Drafts the request's last k tokens again (right where the model repeats itself, wrong elsewhere)."""

    def __init__(self, k: int):
        self.k = k

    def propose(self, req, max_tokens):
        return list(req.all_token_ids[-min(self.k, max_tokens) :]) if max_tokens > 0 else []

    def forget(self, request_id):
        pass


def test_prefix_cache_hits_after_drafting_runs_keep_output(model_dir):
    """Pages and state snapshots a drafting run left behind (rejected drafts' KV overwritten before a page
    is named) serve a follow-up prompt: its tokens equal a cold plain run's."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(model_dir, spec="ngram", draft_tokens=3)
    llm.scheduler.proposer = _EchoDrafts(3)
    first = _generate(llm, params, [PROMPTS[1]])[0]
    follow = [PROMPTS[1] + first.token_ids + [11, 12, 13]]
    again = _generate(llm, params, follow)[0]
    cold = _generate(LLM(model_dir, enable_prefix_caching=False), params, follow)[0]
    assert again.num_cached_tokens > 0 and again.token_ids == cold.token_ids
    assert llm.scheduler.num_draft_tokens > 0


@pytest.mark.parametrize("same_token", [True, False])
def test_a_stop_string_inside_an_accepted_run_that_reaches_the_token_limit_is_the_stop(same_token):
    """A stop string completed by token i of a run of accepted drafts that also reaches max_tokens (a later
    token of the run) ends the output as a stop (the tokens after it dropped), as without drafts; so does
    one completed by the very token that reaches the limit (same_token), as vLLM says it."""
    prompt = "Repeat exactly:\ndef area(w, h):\n    return w * h\n\n"
    greedy = dict(temperature=0.0, ignore_eos=True)
    plain = LLM().generate([prompt], SamplingParams(max_tokens=16, **greedy))[0]
    tok = LLM().tokenizer
    pieces = [tok.decode(plain.token_ids[: i + 1]) for i in range(len(plain.token_ids))]

    def run_end(i: int) -> int:  # the last token of i's step: the prompt's gives token 0, then runs of 5
        return 5 * ((i - 1) // 5) + 5

    # a token not the last of its run that completes a string not seen before it
    i, stop = next(
        (i, new)
        for i in range(1, len(pieces))
        if (new := pieces[i][len(pieces[i - 1]) :]).strip() and new not in pieces[i - 1] and i < run_end(i)
    )
    params = SamplingParams(max_tokens=(i if same_token else run_end(i)) + 1, stop=[stop], **greedy)
    reference = LLM().generate([prompt], params)[0]
    assert (reference.finish_reason, reference.stop_string, reference.token_ids) == (
        "stop",
        stop,
        plain.token_ids[: i + 1],
    )
    llm = LLM(spec="ngram", draft_tokens=4)
    full = {"req-0": plain.prompt_token_ids + plain.token_ids}
    llm.scheduler.proposer = ScriptedDrafts(full, 1000, 4)  # every draft right: runs of 5 tokens
    got = llm.generate([prompt], params)[0]
    assert (got.token_ids, got.text, got.finish_reason, got.stop_string) == (
        reference.token_ids,
        reference.text,
        "stop",
        stop,
    )
    assert same_token or llm.scheduler.num_accepted_tokens > 0  # (the run case: the stop among drafts)
