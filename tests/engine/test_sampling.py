"""Sampler and stop handling through the offline API on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.request import Request
from engine.sample.penalties import apply_penalties
from engine.sample.sampler import Sampler


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path_factory.mktemp("q3")))


PROMPT = [5, 9, 200, 31, 77]


def gen(llm, **kw):
    return llm.generate(prompt_token_ids=PROMPT, sampling_params=SamplingParams(ignore_eos=True, **kw))[0]


def test_seed_reproducible_and_different_seeds_differ(llm):
    a = gen(llm, max_tokens=24, temperature=1.0, seed=1)
    b = gen(llm, max_tokens=24, temperature=1.0, seed=1)
    c = gen(llm, max_tokens=24, temperature=1.0, seed=2)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_top_k_1_and_tiny_top_p_are_greedy(llm):
    greedy = gen(llm, max_tokens=12, temperature=0.0).token_ids
    assert gen(llm, max_tokens=12, temperature=1.5, top_k=1, seed=3).token_ids == greedy
    assert gen(llm, max_tokens=12, temperature=1.5, top_p=1e-6, seed=3).token_ids == greedy


def test_logprobs_hold_chosen_and_top_n(llm):
    out = gen(llm, max_tokens=6, temperature=1.0, seed=5, logprobs=3)
    assert len(out.logprobs) == 6
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert tok in lp and 3 <= len(lp) <= 4
        assert all(v <= 0 for v in lp.values())
        top = sorted(lp.values(), reverse=True)[:3]
        assert math.fsum(math.exp(v) for v in top) <= 1 + 1e-5


def test_max_tokens_gives_length(llm):
    out = gen(llm, max_tokens=5, temperature=0.0)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_sampled_distribution_follows_top_k():
    sampler = Sampler()
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    counts = torch.zeros(5)
    for i in range(2000):
        params = SamplingParams(temperature=1.0, top_k=2, seed=i)
        counts[sampler(logits, [f"r{i}"], [params])[0].token_id] += 1
    assert counts[2:].sum() == 0
    p0 = math.exp(2.0) / (math.exp(2.0) + math.exp(1.0))
    assert abs(counts[0].item() / 2000 - p0) < 0.05


def test_bad_params_are_sentences():
    with pytest.raises(NinferError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(NinferError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(NinferError, match="finite"):
        SamplingParams(temperature=float("nan"))


def test_stop_and_stop_token_ids_of_another_kind_are_sentences():
    with pytest.raises(NinferError, match="stop is a string or a list of strings"):
        SamplingParams(stop=5)
    with pytest.raises(NinferError, match="stop_token_ids is a list of token ids"):
        SamplingParams(stop_token_ids=["</s>"])
    assert SamplingParams(stop="END").stop == ("END",)


def test_values_of_another_kind_are_sentences():
    """The Python API's callers get the field and what it takes, not a comparison's TypeError."""
    for bad, words in (
        (dict(max_tokens=None), "max_tokens must be a whole number (got None)"),
        (dict(temperature="0.5"), "temperature must be a number (got '0.5')"),
        (dict(seed=1.5), "seed must be a whole number or None (got 1.5)"),
        (dict(top_k=True), "top_k must be a whole number (got True)"),
    ):
        with pytest.raises(NinferError) as e:
            SamplingParams(**bad)
        assert str(e.value) == words
    assert SamplingParams(temperature=0, seed=None).greedy  # an int is a number


def test_whole_numbers_past_64_bits_are_sentences_and_a_seed_takes_any_64_bits(llm):
    """A number no tensor (or torch's generator) holds is refused before it reaches the engine loop, where
    it would have stopped the engine for every request; a seed takes signed and unsigned 64-bit values."""
    for bad, words in (
        (dict(seed=2**64), f"seed must fit in 64 bits (got {2**64})"),
        (dict(seed=-(2**63) - 1), f"seed must fit in 64 bits (got {-(2**63) - 1})"),
        (dict(top_k=2**63), f"top_k must fit in 64 bits (got {2**63})"),
        (dict(repeat_last_n=10**30), f"repeat_last_n must fit in 64 bits (got {10**30})"),
    ):
        with pytest.raises(NinferError) as e:
            SamplingParams(**bad)
        assert str(e.value) == words
    unsigned = gen(llm, max_tokens=8, temperature=1.0, seed=2**64 - 1)
    assert (
        unsigned.token_ids == gen(llm, max_tokens=8, temperature=1.0, seed=-1).token_ids
    )  # two's complement
    assert gen(llm, max_tokens=8, temperature=1.0, seed=-(2**63)).token_ids


def test_sizes_as_the_cli_writes_them(tmp_path):
    from engine.config import EngineConfig

    config = EngineConfig(model="", max_context="2k", kv_capacity="4k", host_cache="64M")
    assert (config.max_context, config.kv_capacity, config.host_cache) == (2048, 4096, 64 << 20)
    assert EngineConfig(model="", kv_capacity="auto").kv_capacity == "auto"
    with pytest.raises(NinferError, match="max_context 'lots' is not a size"):
        EngineConfig(model="", max_context="lots")
    with pytest.raises(NinferError, match=r"max_context must be a whole number \(got 2.5\)"):
        EngineConfig(model="", max_context=2.5)


def test_one_sampling_params_per_prompt_as_vllm_takes_them(llm):
    """generate() takes a list of SamplingParams, one per prompt: each prompt runs as with its own alone."""
    short, long = SamplingParams(max_tokens=3, temperature=0.0), SamplingParams(max_tokens=7, temperature=0.0)
    outs = llm.generate(prompt_token_ids=[PROMPT, PROMPT[:3]], sampling_params=[short, long])
    alone = [
        llm.generate(prompt_token_ids=p, sampling_params=sp)[0]
        for p, sp in ((PROMPT, short), (PROMPT[:3], long))
    ]
    assert [len(o.token_ids) for o in outs] == [3, 7]
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone]
    with pytest.raises(NinferError, match=r"lists 1 SamplingParams for 2 prompt\(s\); give one per prompt"):
        llm.generate(prompt_token_ids=[PROMPT, PROMPT], sampling_params=[short])
    with pytest.raises(NinferError, match="a SamplingParams, or a list of them"):
        llm.generate(prompt_token_ids=[PROMPT], sampling_params=[{"max_tokens": 3}])
    assert not llm.has_unfinished_requests()


def test_out_of_vocab_prompt(llm):
    with pytest.raises(NinferError, match="outside the vocabulary"):
        llm.generate(prompt_token_ids=[1, 99999], sampling_params=SamplingParams())


def test_a_bad_prompt_in_a_batch_leaves_nothing_queued(llm):
    with pytest.raises(NinferError, match="empty"):
        llm.generate(prompt_token_ids=[[5, 6, 7], []], sampling_params=SamplingParams())
    assert not llm.has_unfinished_requests()


def test_text_generation_needs_a_tokenizer(llm):
    with pytest.raises(NinferError, match="no tokenizer"):
        llm.generate("hello")


def test_min_p_one_is_greedy(llm):
    greedy = gen(llm, max_tokens=12, temperature=0.0).token_ids
    assert gen(llm, max_tokens=12, temperature=2.0, min_p=1.0, seed=4).token_ids == greedy


def test_strong_repetition_penalty_never_repeats(llm):
    out = gen(llm, max_tokens=24, temperature=0.0, repetition_penalty=1e4)
    assert len(set(out.token_ids)) == 24
    assert not set(out.token_ids) & set(PROMPT)


def history(prompt_ids: list[int], output_ids: list[int]):
    req = Request("r", prompt_ids, SamplingParams())
    req.output_token_ids = output_ids
    return req.token_history()


def test_penalty_arithmetic():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    params = SamplingParams(repetition_penalty=2.0)
    out = apply_penalties(logits.clone(), params, history([0], [1]))
    assert out.tolist() == [1.0, -2.0, 0.5, 3.0]
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits.clone(), params, history([3], [2, 2, 0]))
    assert out.tolist() == [2.0 - 0.75, -1.0, 0.5 - 1.0, 3.0]


def test_repeat_last_n_counts_the_window_of_prompt_and_output():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    # llama.cpp's: the last 3 tokens of prompt + output ([3, 2, 2]) for all three penalties
    params = SamplingParams(
        repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25, repeat_last_n=3
    )
    out = apply_penalties(logits.clone(), params, history([0, 1, 3], [2, 2]))
    assert out.tolist() == [2.0, -1.0, 0.25 - 1.0, 1.5 - 0.75]
    # -1: the whole context
    params = SamplingParams(presence_penalty=1.0, repeat_last_n=-1)
    out = apply_penalties(logits.clone(), params, history([0, 1], [3]))
    assert out.tolist() == [1.0, -2.0, 0.5, 2.0]
    assert not SamplingParams(repetition_penalty=2.0, repeat_last_n=0).needs_history


def finished_token_ids(llm) -> dict[str, list[int]]:
    """Step the LLM until every queued request ends; the output token ids of each."""
    done = {}
    while llm.has_unfinished_requests():
        for out, _ in llm.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    return done


def test_penalised_requests_batched_with_plain_ones_keep_their_outputs(llm):
    plain = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    penal = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, frequency_penalty=1.5)
    alone = [llm.generate(prompt_token_ids=PROMPT, sampling_params=p)[0].token_ids for p in (plain, penal)]
    a = llm.add_request(PROMPT, plain)
    b = llm.add_request(PROMPT, penal)
    done = finished_token_ids(llm)
    assert [done[a], done[b]] == alone


def test_a_seeded_request_samples_the_same_whatever_else_is_in_the_batch(llm):
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)
    alone = llm.generate(prompt_token_ids=PROMPT, sampling_params=seeded)[0].token_ids
    others = [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=1.3, top_k=5, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.8, min_p=0.1, seed=3, ignore_eos=True),
    ]
    ids = [llm.add_request([7, 8, 9, 10][: i + 1], p) for i, p in enumerate(others)]
    rid = llm.add_request(PROMPT, seeded)
    done = finished_token_ids(llm)
    assert done[rid] == alone and set(done) == {rid, *ids}


def test_batched_filters_match_each_rows_own_settings():
    """top_k, top_p and min_p per row in one batch: each row keeps exactly the tokens its settings allow."""
    sampler = Sampler()
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    rows = [
        SamplingParams(temperature=1.0, top_k=2),  # {0, 1}
        SamplingParams(temperature=1.0, top_p=0.7),  # 0.5 + 0.3 reaches 0.7: {0, 1}
        SamplingParams(temperature=1.0, min_p=0.5),  # >= 0.25: {0, 1}
        SamplingParams(temperature=1.0),  # all
    ]
    seen = [set() for _ in rows]
    for i in range(400):
        out = sampler(logits, [f"{i}-{j}" for j in range(4)], rows)
        for j, t in enumerate(out):
            seen[j].add(t.token_id)
    assert seen[:3] == [{0, 1}] * 3 and seen[3] == {0, 1, 2, 3}


def test_logit_bias_bans_and_forces_tokens(llm):
    greedy = gen(llm, max_tokens=12, temperature=0.0).token_ids
    banned = set(greedy[:3])
    out = gen(llm, max_tokens=12, temperature=0.0, logit_bias={t: -100 for t in banned}).token_ids
    assert not banned & set(out) and out != greedy
    for temperature in (0.0, 1.0):
        forced = gen(llm, max_tokens=6, temperature=temperature, seed=0, logit_bias=((77, 100.0),))
        assert forced.token_ids == [77] * 6
    # a small bias shifts a row without touching the others in the batch
    prompts = [PROMPT, list(range(30, 40))]
    plain = llm.generate(
        prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    params = [
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logit_bias={plain[0].token_ids[0]: -100})
    ]
    rid = llm.add_request(prompts[0], params[0])
    other = llm.add_request(prompts[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    done = finished_token_ids(llm)
    assert done[other] == plain[1].token_ids and done[rid][0] != plain[0].token_ids[0]


def test_bad_logit_bias_is_refused(llm):
    with pytest.raises(NinferError, match="between -100 and 100"):
        SamplingParams(logit_bias={5: 101})
    with pytest.raises(NinferError, match="between -100 and 100"):
        SamplingParams(logit_bias={-1: 1})
    with pytest.raises(NinferError, match="logit_bias token id 99999 is outside the vocabulary"):
        gen(llm, logit_bias={99999: 1.0})
    assert not llm.scheduler.has_unfinished_requests()


def test_min_tokens_bans_the_end_until_reached(llm):
    # EOS (id 2) forced by a bias: without min_tokens the output is that one token
    forced_eos = {2: 100.0}
    out = llm.generate(
        prompt_token_ids=PROMPT,
        sampling_params=SamplingParams(temperature=0, max_tokens=20, logit_bias=forced_eos),
    )[0]
    assert (out.token_ids, out.finish_reason) == ([2], "stop")
    for temperature in (0.0, 1.0):
        params = SamplingParams(
            temperature=temperature, seed=3, max_tokens=20, min_tokens=6, logit_bias=forced_eos
        )
        out = llm.generate(prompt_token_ids=PROMPT, sampling_params=params)[0]
        assert len(out.token_ids) == 7 and 2 not in out.token_ids[:6]
        assert (out.token_ids[6], out.finish_reason) == (2, "stop")
    # ignore_eos (gen's): EOS is not an end, so min_tokens leaves it alone (as vLLM)
    assert gen(llm, temperature=0, max_tokens=4, min_tokens=4, logit_bias=forced_eos).token_ids == [2] * 4


def test_min_tokens_bans_stop_token_ids_and_otherwise_keeps_the_greedy_tokens(llm):
    plain = gen(llm, max_tokens=30, temperature=0.0).token_ids
    stop = plain[4]
    first = plain.index(stop)
    ended = gen(llm, max_tokens=30, temperature=0.0, stop_token_ids=[stop])
    assert ended.token_ids == plain[: first + 1] and ended.finish_reason == "stop"
    held = gen(llm, max_tokens=30, temperature=0.0, stop_token_ids=[stop], min_tokens=12)
    assert len(held.token_ids) >= 12 and stop not in held.token_ids[:12]
    assert held.token_ids[:first] == plain[:first]
    # the same tokens as banning `stop` outright for those 12 steps
    banned = gen(llm, max_tokens=12, temperature=0.0, logit_bias={stop: -100})
    assert held.token_ids[:12] == banned.token_ids
    # and then the stop token may end it again
    assert (held.finish_reason, held.token_ids[-1]) == ("stop", stop) or len(held.token_ids) == 30


def test_min_tokens_rows_in_a_batch_are_their_own(llm):
    forced_eos = {2: 100.0}
    prompts = [PROMPT, list(range(30, 40))]
    params = [
        SamplingParams(temperature=0, max_tokens=10, min_tokens=3, logit_bias=forced_eos),
        SamplingParams(temperature=0, max_tokens=10, logit_bias=forced_eos),
    ]
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = finished_token_ids(llm)
    assert len(done[ids[0]]) == 4 and done[ids[0]][-1] == 2
    assert done[ids[1]] == [2]


def test_bad_min_tokens_are_refused():
    with pytest.raises(NinferError, match=r"min_tokens must be between 0 and max_tokens \(8\) \(got 9\)"):
        SamplingParams(max_tokens=8, min_tokens=9)
    with pytest.raises(NinferError, match="min_tokens must be between 0"):
        SamplingParams(min_tokens=-1)
    with pytest.raises(NinferError, match="min_tokens does not go with structured outputs"):
        SamplingParams(min_tokens=2, grammar="start: /[a-z]+/")


def test_stop_strings_wait_for_min_tokens_and_may_stay_in_the_text():
    from conftest import byte_tokenizer

    from engine.output_processor import RequestStream
    from engine.request import Request

    tok = byte_tokenizer()

    def stream(min_tokens: int, text: str, stop=("X", "YZ"), include: bool = False) -> RequestStream:
        params = SamplingParams(
            stop=list(stop), min_tokens=min_tokens, max_tokens=16, include_stop_str_in_output=include
        )
        s = RequestStream(Request("r", [0], params), tok, None)
        deltas = ""
        for t in tok.encode(text):
            s.push(t)
            deltas += s.take_delta(s.stopped)
            if s.stopped:
                break
        assert deltas == s.text  # streamed, the same text
        return s

    assert stream(0, "aXbXc").text == "a"
    assert stream(3, "aXbXc").text == "aXb"  # the X of token 2 is before min_tokens; that of token 4 ends it
    s = stream(3, "aYZbYZ")  # "YZ" completes at token 3: allowed, as it ends with the min_tokens-th token
    assert (s.text, s.matched_stop) == ("a", "YZ")
    s = stream(4, "aYZbYZ")  # here the first YZ ended before: only the second counts
    assert (s.text, s.matched_stop) == ("aYZb", "YZ")
    # vLLM's include_stop_str_in_output: the text ends with the stop string, the earliest of those found
    assert stream(0, "aXbXc", include=True).text == "aX"
    assert stream(3, "aYZbYZ", include=True).text == "aYZ"
    s = stream(0, "aXYZb", stop=("YZ", "XYZ"), include=True)  # both complete at Z: XYZ starts first
    assert (s.text, s.matched_stop) == ("aXYZ", "XYZ")


def test_allowed_token_ids_hold_every_sampled_token(llm, tmp_path):
    """vLLM's allowed_token_ids: greedy takes the likeliest allowed token (the model's logprobs tell which),
    sampling never leaves the set, drafts outside it are refused; out-of-vocabulary ids and an empty list
    are sentences."""
    free = gen(llm, max_tokens=1, temperature=0.0, logprobs=20)
    ranked = sorted(free.logprobs[0], key=free.logprobs[0].get, reverse=True)
    allowed = [ranked[5], ranked[2], 7]  # the third likeliest, the sixth, and one far down
    greedy = gen(llm, max_tokens=1, temperature=0.0, allowed_token_ids=allowed)
    assert greedy.token_ids == [ranked[2]]
    sampled = gen(llm, max_tokens=30, temperature=1.5, seed=4, allowed_token_ids=allowed)
    assert set(sampled.token_ids) <= set(allowed) and len(set(sampled.token_ids)) > 1
    # n-gram drafts copy the repeated prompt; every one but 7 is refused
    spec = LLM(save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path), spec="ngram", draft_tokens=3)
    only_7 = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, allowed_token_ids=[7])
    drafted = spec.generate(prompt_token_ids=[7] * 20, sampling_params=only_7)[0]
    assert drafted.token_ids == [7] * 12 and drafted.num_accepted_tokens > 0
    refused = spec.generate(prompt_token_ids=PROMPT * 4, sampling_params=only_7)[0]
    assert refused.token_ids == [7] * 12
    with pytest.raises(NinferError, match="allowed_token_ids holds 999999, outside the vocabulary"):
        gen(llm, max_tokens=2, allowed_token_ids=[999999])
    with pytest.raises(NinferError, match="allowed_token_ids must be a non-empty list"):
        SamplingParams(allowed_token_ids=[])
