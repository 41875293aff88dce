"""llama.cpp's samplers beside vLLM's: DRY against a plain reference of its definition, typical_p against
transformers' warper, top-n-sigma, XTC, dynamic temperature and Mirostat by their arithmetic, repeat_last_n's
window; then through the engine on a tiny model with the embedded tokenizer (DRY's breakers, drafts
verified, Mirostat drafting nothing)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from conftest import save_tiny, save_tiny_with_tokenizer, tiny_hf_model
from test_spec_decode import ScriptedDrafts

from engine import LLM, NinferError, SamplingParams
from engine.request import Request
from engine.sample.dry import MAX_PENALTY, MAX_RUN, BreakerMasks, DryBreakers, breaker_mask, dry_penalties
from engine.sample.filters import dynamic_temperature, mirostat, sampling_probs, top_n_sigma, typical, xtc
from engine.sample.sampler import Sampler

DRY = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)


def reference_dry(
    tokens: list[int], breakers: set[int], multiplier: float, base: float, allowed: int, sequences=()
):
    """DRY as defined: {token: penalty}, one occurrence at a time; a position breaks when its token is in
    `breakers` or it lies inside an occurrence of one of `sequences`."""

    def breaks(p: int) -> bool:
        p %= len(tokens)
        inside = any(
            tokens[start : start + len(seq)] == list(seq)
            for seq in sequences
            for start in range(p - len(seq) + 1, p + 1)
            if start >= 0
        )
        return tokens[p] in breakers or inside

    last = tokens[-1]
    if breaks(-1):
        return {}
    longest: dict[int, int] = {}
    for i in range(len(tokens) - 1):
        if tokens[i] != last or breaks(i + 1):
            continue
        run = 1
        while run < MAX_RUN and i - run >= 0 and tokens[i - run] == tokens[-1 - run] and not breaks(-1 - run):
            run += 1
        longest[tokens[i + 1]] = max(longest.get(tokens[i + 1], 0), run)
    return {
        t: min(multiplier * base ** (n - allowed), MAX_PENALTY) for t, n in longest.items() if n >= allowed
    }


def _dry(tokens: list[int], breakers: set[int] = frozenset(), sequences=(), **params) -> dict[int, float]:
    mask = np.zeros(64, dtype=bool)
    mask[list(breakers)] = True
    found = DryBreakers(mask, tuple(np.asarray(seq, dtype=np.int64) for seq in sequences))
    ids, penalties = dry_penalties(
        np.asarray(tokens, dtype=np.int64),
        found if breakers or sequences else None,
        SamplingParams(**{**DRY, **params}),
    )
    return dict(zip(ids.tolist(), penalties.tolist()))


def test_dry_penalizes_the_token_that_would_extend_a_repeat():
    # A B C D ... A B C: D would repeat "A B C D"; the run before it is 3 tokens
    assert _dry([1, 2, 3, 4, 9, 1, 2, 3]) == pytest.approx({4: 0.8 * 1.75 ** (3 - 2)})
    # a run of 1 (C alone) is allowed at dry_allowed_length 2; at 1 it is penalized
    assert _dry([3, 4, 9, 7, 3]) == {}
    assert _dry([3, 4, 9, 7, 3], dry_allowed_length=1) == pytest.approx({4: 0.8})
    # the longest run over the occurrences counts, per following token
    tokens = [5, 3, 4, 1, 2, 3, 6, 8, 1, 2, 3]
    assert _dry(tokens) == pytest.approx({6: 0.8 * 1.75})  # 4 follows a run of 1: allowed
    assert _dry(tokens, dry_allowed_length=1) == pytest.approx({6: 0.8 * 1.75**2, 4: 0.8})


def test_dry_stops_at_sequence_breakers():
    tokens = [1, 2, 3, 4, 9, 1, 2, 3]
    assert _dry(tokens, {3}) == {}  # the last token is a breaker: nothing this step
    assert _dry(tokens, {4}) == {}  # a breaker after an occurrence is never penalized
    # the run does not reach back across a breaker: "1" breaks it, "2 3" is a run of 2
    assert _dry(tokens, {1}) == pytest.approx({4: 0.8})


def test_dry_stops_at_breakers_of_several_tokens():
    """A breaker that tokenizes to several tokens breaks wherever its sequence occurs."""
    tokens = [7, 8, 1, 2, 3, 4, 9, 1, 2, 3]
    assert _dry(tokens) == pytest.approx({4: 0.8 * 1.75})
    assert _dry(tokens, sequences=[(2, 3)]) == {}  # the context ends inside one
    assert _dry(tokens, sequences=[(1, 2)]) == {}  # the run stops at it: 1 token, allowed
    assert _dry(tokens, sequences=[(1, 2)], dry_allowed_length=1) == pytest.approx({4: 0.8})
    assert _dry([1, 2, 3, 4, 5, 9, 1, 2, 3], sequences=[(4, 5)]) == {}  # the follower lies inside one
    assert _dry(tokens, sequences=[(4, 1)]) == pytest.approx({4: 0.8 * 1.75})  # nowhere: no effect


def test_dry_matches_its_reference_on_random_histories():
    rng = random.Random(0)
    for case in range(300):
        vocab = rng.choice([3, 5, 12])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(2, 120))]
        if case % 3 == 0:  # long loops, past MAX_RUN
            tokens = (tokens[:4] * 40)[: rng.randrange(2, 160)]
        breakers = set(rng.sample(range(vocab), rng.randrange(0, 2)))
        sequences = [tuple(rng.randrange(vocab) for _ in range(rng.choice([2, 3])))] if case % 4 == 1 else []
        allowed = rng.choice([1, 2, 4])
        base = rng.choice([1.0, 1.75, 3.0])
        want = reference_dry(tokens, breakers, 0.8, base, allowed, sequences)
        got = _dry(tokens, breakers, sequences, dry_allowed_length=allowed, dry_base=base)
        assert got == pytest.approx(want), (tokens, breakers)


def test_dry_penalties_stay_finite_on_a_loop():
    got = _dry([7, 8] * 500, dry_multiplier=5.0, dry_base=1000.0)
    assert got == {7: MAX_PENALTY}


def test_token_history_tail_is_the_window_of_prompt_and_output():
    req = Request("r", [1, 2, 3, 4], SamplingParams())
    req.output_token_ids = [5, 6]
    history = req.token_history()
    assert history.tail(-1).tolist() == [1, 2, 3, 4, 5, 6]
    assert history.tail(1).tolist() == [6]
    assert history.tail(2).tolist() == [5, 6]
    assert history.tail(3).tolist() == [4, 5, 6]
    assert history.tail(100).tolist() == [1, 2, 3, 4, 5, 6]
    assert history.prompt_unique.tolist() == [1, 2, 3, 4]


def test_breakers_of_several_tokens_are_kept_as_their_sequences(default_tokenizer):
    tok = default_tokenizer
    masks = BreakerMasks(tok, tok.vocab_size, "m")
    found = masks(SamplingParams(dry_multiplier=0.8, dry_sequence_breakers=["\n", "Seraphina"]))
    pieces = [tok.encode(v, add_special_tokens=False) for v in ("Seraphina", " Seraphina")]
    assert all(len(p) >= 2 for p in pieces)  # no single token holds the name
    assert sorted(seq.tolist() for seq in found.sequences) == sorted(pieces)
    assert masks(SamplingParams(dry_multiplier=0.8)).sequences == ()  # the defaults: single characters
    assert masks(SamplingParams(dry_multiplier=0.8, dry_sequence_breakers=["\n", "Seraphina"])) is found


def test_breaker_mask_marks_tokens_holding_a_breaker(default_tokenizer):
    tok = default_tokenizer
    mask = breaker_mask(tok.vocab_bytes, tok.vocab_size + 3, ("\n", ":"))
    assert mask.shape == (tok.vocab_size + 3,) and not mask[-3:].any()
    for text in ("\n", "\n\n", ":", " Note:"):
        for token_id in tok.encode(text, add_special_tokens=False):
            assert mask[token_id] == any(b in tok.token_bytes(token_id) for b in (b"\n", b":"))
    assert mask[tok.encode("\n", add_special_tokens=False)].all()
    assert not mask[tok.encode(" Paris", add_special_tokens=False)].any()


@pytest.mark.parametrize(
    "breakers", [("\n", ":", '"', "*"), ("é", "the"), ("\0x",), ("<|im_end|>",), ("a", "ab")]
)
def test_breaker_mask_is_the_token_by_token_scan(default_tokenizer, breakers):
    tok = default_tokenizer
    mask = breaker_mask(tok.vocab_bytes, tok.vocab_size, breakers)
    needles = [b.encode() for b in breakers]
    assert mask.tolist() == [any(n in tok.token_bytes(i) for n in needles) for i in range(tok.vocab_size)]


@pytest.mark.parametrize("mass", [0.2, 0.5, 0.9, 0.99])
def test_typical_keeps_what_transformers_keeps(mass):
    from transformers.generation.logits_process import TypicalLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    want = TypicalLogitsWarper(mass=mass)(None, logits.clone()).isinf()
    got = typical(logits, torch.full((6, 1), mass)).isinf()
    assert torch.equal(got, want)
    assert torch.equal(typical(logits, torch.ones(6, 1)), logits)  # 1: off


def test_top_n_sigma_keeps_logits_within_n_deviations():
    torch.manual_seed(1)
    logits = torch.randn(3, 40)
    logits[2, :10] = float("-inf")  # masked tokens are not part of the statistics
    n = torch.tensor([[1.0], [0.0], [2.0]])
    got = top_n_sigma(logits, n)
    for row in (0, 2):
        finite = logits[row][logits[row].isfinite()].double()
        floor = finite.max() - n[row, 0].item() * finite.std(unbiased=False)
        assert torch.equal(got[row].isfinite(), logits[row].double() >= floor)
    assert torch.equal(got[1], logits[1])  # n 0: off


def test_xtc_drops_the_top_choices_but_the_least_of_them():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 3)
    x = probs.log()
    on = torch.tensor([[True], [True], [False]])
    got = xtc(x, torch.tensor([[0.25], [0.35], [0.25]]), on)
    assert got[0].isinf().tolist() == [True, False, False, False]  # 0.4 goes, 0.3 (the least above) stays
    assert torch.equal(got[1], x[1])  # one token above the threshold: nothing
    assert torch.equal(got[2], x[2])  # the coin did not come up


def test_xtc_through_the_sampler_never_draws_the_top_token():
    sampler = Sampler()
    logits = torch.tensor([[3.0, 2.9, 0.0, -1.0]])
    on = [SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.3, seed=i) for i in range(200)]
    off = [SamplingParams(temperature=1.0, seed=i) for i in range(200)]
    drawn = {sampler(logits, [f"on{i}"], [p])[0].token_id for i, p in enumerate(on)}
    assert 0 not in drawn and 1 in drawn
    assert 0 in {sampler(logits, [f"off{i}"], [p])[0].token_id for i, p in enumerate(off)}


def test_dynamic_temperature_follows_the_entropy():
    flat = torch.zeros(1, 8)  # entropy at its most: temperature + range
    peaked = torch.tensor([[50.0, 0, 0, 0, 0, 0, 0, 0]])  # entropy ~0: temperature - range
    half = torch.tensor([[0.0, 0.0, -1e4, -1e4]])  # log 2 of log 4 with exponent 2: a quarter of the way
    t, spread = torch.tensor([[1.0]]), torch.tensor([[0.5]])
    exponent = torch.tensor([[1.0]])
    assert dynamic_temperature(flat, t, spread, exponent).item() == pytest.approx(1.5)
    assert dynamic_temperature(peaked, t, spread, exponent).item() == pytest.approx(0.5, abs=1e-3)
    got = dynamic_temperature(half, t, spread, torch.tensor([[2.0]])).item()
    assert got == pytest.approx(0.5 + 1.0 * 0.25, abs=1e-3)
    assert dynamic_temperature(flat, t, torch.zeros(1, 1), exponent).item() == 1.0  # off
    # through sampling_probs: a peaked row sharpens below temperature 1, a flat one flattens above it
    params = [SamplingParams(temperature=1.0, dynatemp_range=0.5)] * 2
    logits = torch.tensor([[5.0, 0.0], [0.3, 0.0]])
    probs = sampling_probs(logits, params, None)
    plain = logits.softmax(-1)
    assert probs[0, 0] > plain[0, 0] and probs[1, 0] < plain[1, 0]


def reference_mirostat_1_k(probs: list[float], mu: float, m: int = 100) -> int:
    """llama.cpp's Mirostat 1 k, step by step over the sorted probabilities."""
    p = sorted(probs, reverse=True)
    num = den = 0.0
    for i in range(min(m - 1, len(p) - 1)):
        t = math.log((i + 2) / (i + 1))
        num += t * math.log(p[i] / p[i + 1])
        den += t * t
    s = num / den
    e = s - 1
    return max(1, min(len(p), int((e * 2**mu / (1 - len(p) ** (-e))) ** (1 / s))))


def test_mirostat_truncations():
    torch.manual_seed(3)
    x = torch.randn(2, 300) * 2
    probs = x.softmax(-1)
    mu = torch.tensor([[4.0], [6.5]])
    # version 2: the tokens whose surprise is at most mu bits (always the top one)
    got = mirostat(x, torch.tensor([[2], [2]]), mu, version_1=False)
    assert torch.equal(got.isfinite(), (-torch.log2(probs) <= mu) | (probs == probs.amax(-1, keepdim=True)))
    assert torch.equal(
        mirostat(x, torch.tensor([[2], [2]]), torch.zeros(2, 1), False).isfinite().sum(-1),
        torch.ones(2, dtype=torch.long),
    )
    # version 1: the top k, k from the estimated Zipf exponent
    got = mirostat(x, torch.tensor([[1], [1]]), mu)
    for row in range(2):
        k = reference_mirostat_1_k(probs[row].tolist(), mu[row].item())
        assert got[row].isfinite().sum().item() == k
    # mode 0 rows are left alone, beside a Mirostat row
    got = mirostat(x, torch.tensor([[0], [2]]), mu, version_1=False)
    assert torch.equal(got[0], x[0]) and not got[1].isfinite().all()


def test_mirostat_rows_take_no_other_truncation():
    """A Mirostat row's distribution is the plain temperature's under Mirostat's truncation alone: top-k,
    XTC (its coin up), dynamic temperature and the rest are off for it."""
    torch.manual_seed(5)
    logits = torch.randn(1, 500)
    logits[0, :3] = torch.tensor([6.0, 5.8, 5.6])  # three likely tokens: XTC at 0.1 would drop two of them
    alone = SamplingParams(temperature=0.9, mirostat=2)
    mixed = SamplingParams(
        temperature=0.9, mirostat=2, top_k=3, xtc_probability=1.0, dynatemp_range=0.5, typical_p=0.5
    )
    want = sampling_probs(logits, [alone], None, [12.0])  # mu 12 bits: the tail stays too
    got = sampling_probs(logits, [mixed], torch.tensor([True]), [12.0])
    assert torch.equal(got, want) and (want > 0).sum() > 3
    plain = SamplingParams(temperature=0.9, xtc_probability=1.0)  # (without Mirostat, XTC drops them)
    assert (sampling_probs(logits, [plain], torch.tensor([True]))[0, :3] == 0).sum() == 2


def test_mirostat_steers_the_surprise_toward_tau():
    """mu moves by eta x (surprise - tau) a token; over many tokens the surprise averages about tau."""
    sampler = Sampler()
    torch.manual_seed(4)
    logits = (torch.randn(1, 2000) * 3).sort(descending=True).values  # a long-tailed distribution
    params = SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=3.0, mirostat_eta=0.1, seed=7)
    # the first token: its surprise under the tokens within 2 tau = 6 bits, renormalized
    token = sampler(logits, ["r"], [params])[0].token_id
    kept = logits[0].masked_fill(-torch.log2(logits[0].softmax(-1)) > 6.0, float("-inf")).softmax(-1)
    surprise = -math.log2(kept[token].item())
    assert sampler._mirostat_mu["r"] == pytest.approx(6.0 - 0.1 * (surprise - 3.0), rel=1e-5)
    surprises = []
    for position in range(1, 601):
        mu = sampler._mirostat_mu["r"]
        token = sampler(logits, ["r"], [params], positions=[position])[0].token_id
        kept = logits[0].masked_fill(-torch.log2(logits[0].softmax(-1)) > mu, float("-inf")).softmax(-1)
        surprises.append(-math.log2(kept[token].item()))
    assert abs(sum(surprises[100:]) / 500 - 3.0) < 0.3
    sampler.forget("r")
    assert "r" not in sampler._mirostat_mu


def test_sampler_fields_are_checked():
    with pytest.raises(NinferError, match="typical_p must be in"):
        SamplingParams(typical_p=0.0)
    with pytest.raises(NinferError, match="xtc_probability must be in"):
        SamplingParams(xtc_probability=1.5)
    with pytest.raises(NinferError, match="dry_base must be >= 1"):
        SamplingParams(dry_multiplier=0.8, dry_base=0.5)
    with pytest.raises(NinferError, match="dry_allowed_length must be >= 1"):
        SamplingParams(dry_multiplier=0.8, dry_allowed_length=0)
    with pytest.raises(NinferError, match="dry_sequence_breakers is a list of non-empty strings"):
        SamplingParams(dry_sequence_breakers=["\n", ""])
    with pytest.raises(NinferError, match="repeat_last_n must be -1"):
        SamplingParams(repeat_last_n=-2)
    with pytest.raises(NinferError, match="dry_allowed_length must be a whole number"):
        SamplingParams(dry_allowed_length=2.5)
    with pytest.raises(NinferError, match="finite"):
        SamplingParams(dynatemp_range=math.inf)
    with pytest.raises(NinferError, match=r"mirostat must be 0 \(off\), 1 or 2"):
        SamplingParams(mirostat=3)
    with pytest.raises(NinferError, match="mirostat_tau and mirostat_eta must be > 0"):
        SamplingParams(mirostat=1, mirostat_eta=0.0)
    # a sampler left off is not checked further (clients send every field with its default)
    SamplingParams(dry_multiplier=0.0, dry_base=0.0, xtc_probability=0.0, xtc_threshold=7.0)
    assert SamplingParams(dry_sequence_breakers="\n").dry_sequence_breakers == ("\n",)


GREEDY = dict(temperature=0.0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory, default_tokenizer):
    return LLM(save_tiny_with_tokenizer(tmp_path_factory.mktemp("llama_samplers"), default_tokenizer))


@pytest.fixture(scope="module")
def prompt(default_tokenizer):
    return default_tokenizer.encode("one two three four one two three four one two", add_special_tokens=False)


def _penalized_picks(llm, prompt: list[int], out: list[int], **dry) -> list[int]:
    """The output positions whose token DRY penalizes, given everything before it."""
    found = llm.dry_breakers(SamplingParams(**{**DRY, **dry}))
    breakers = set(np.flatnonzero(found.mask).tolist()) if found is not None else set()
    sequences = [seq.tolist() for seq in found.sequences] if found is not None else []
    picks = []
    for i, token in enumerate(out):
        context = prompt + out[:i]
        allowed = dry.get("dry_allowed_length", 2)
        if token in reference_dry(context, breakers, 1.0, 1.75, allowed, sequences):
            picks.append(i)
    return picks


@pytest.mark.parametrize("breakers", [None, []])
def test_dry_keeps_the_output_off_repeats(llm, prompt, breakers):
    kw = {} if breakers is None else {"dry_sequence_breakers": breakers}
    plain = llm.generate(None, SamplingParams(**GREEDY), [prompt])[0].token_ids
    assert _penalized_picks(llm, prompt, plain, **kw), "the greedy output repeats nothing: no test"
    params = SamplingParams(**GREEDY, dry_multiplier=1e6, **kw)
    out = llm.generate(None, params, [prompt])[0].token_ids
    assert _penalized_picks(llm, prompt, out, **kw) == []
    first = _penalized_picks(llm, prompt, plain, **kw)[0]
    assert out[:first] == plain[:first] and out[first] != plain[first]


def test_dry_within_its_window_only(llm, prompt):
    # a window of 3 tokens holds no earlier occurrence of anything: the output is the greedy one
    plain = llm.generate(None, SamplingParams(**GREEDY), [prompt])[0].token_ids
    params = SamplingParams(**GREEDY, dry_multiplier=1e6, dry_penalty_last_n=2)
    assert llm.generate(None, params, [prompt])[0].token_ids == plain


def test_dry_with_drafts_gives_the_output_without(llm, prompt):
    """Drafts of the output without DRY: the rows where DRY differs reject them, and the output is DRY's."""
    params = SamplingParams(**GREEDY, dry_multiplier=1e6)
    want = llm.generate(None, params, [prompt])[0].token_ids
    plain = llm.generate(None, SamplingParams(**GREEDY), [prompt])[0].token_ids
    drafted = LLM(llm.engine_config.model, spec="ngram", draft_tokens=4)
    drafted.scheduler.proposer = ScriptedDrafts({"req-0": prompt + plain}, 1000, 4)
    out = drafted.generate(None, params, [prompt])[0]
    assert out.token_ids == want and drafted.scheduler.num_accepted_tokens > 0


def test_dry_breakers_need_a_tokenizer(tmp_path):
    bare = LLM(save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path))
    with pytest.raises(NinferError, match="no tokenizer to find DRY's sequence breakers"):
        bare.generate(None, SamplingParams(**GREEDY, dry_multiplier=0.8), [[1, 2, 3]])
    out = bare.generate(
        None, SamplingParams(**GREEDY, dry_multiplier=0.8, dry_sequence_breakers=[]), [[1, 2, 3]]
    )
    assert len(out[0].token_ids) == GREEDY["max_tokens"]


def test_mirostat_requests_draft_nothing_and_reproduce(llm, prompt):
    drafted = LLM(llm.engine_config.model, spec="ngram", draft_tokens=4)
    params = SamplingParams(
        max_tokens=32, ignore_eos=True, temperature=1.0, mirostat=2, mirostat_tau=3.0, seed=5
    )
    a, b = (drafted.generate(None, params, [prompt])[0] for _ in range(2))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 32 and a.num_draft_tokens == 0
    # greedy: Mirostat has nothing to steer, drafts run as usual
    greedy = drafted.generate(None, SamplingParams(**GREEDY, mirostat=2), [prompt])[0]
    assert greedy.token_ids == llm.generate(None, SamplingParams(**GREEDY), [prompt])[0].token_ids
    assert greedy.num_draft_tokens > 0
