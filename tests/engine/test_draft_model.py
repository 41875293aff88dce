"""Speculative decoding with a draft model (spec draft, engine/spec/draft_model.py): the output is the
target's own greedy tokens whatever the draft; a draft that is the target itself sees its drafts accepted;
the draft's KV rides the target's pages (prefix-cache hits, a pool tight enough to preempt, quantized KV);
what cannot draft is refused in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import hf_greedy_reference, save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams

PROMPTS = [
    [5, 17, 33, 2, 91, 45, 12, 7, 88, 3, 140, 61, 9, 27, 19, 4, 55, 76, 8, 101, 7, 3],
    [3, 1, 4, 1, 5, 9, 2, 6],
    [7, 7, 7, 12, 12, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52],
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    model = tiny_hf_model("qwen3", tied=False, seed=1)
    return model, save_tiny(model, tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A smaller model of the same vocabulary: another width, other weights."""
    model = tiny_hf_model("qwen3", tied=True, seed=9, hidden_size=32, num_key_value_heads=1)
    return save_tiny(model, tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="module")
def plain(target):
    llm = LLM(target[1], max_concurrency=2)
    return [out.token_ids for out in llm.generate(None, GREEDY, PROMPTS)]


def _spec(path, draft, **options) -> LLM:
    return LLM(path, spec="draft", draft_model=str(draft), draft_tokens=3, block_size=8, **options)


def test_the_output_is_the_targets_greedy_tokens(target, plain, other_draft):
    model, path = target
    assert plain[0] == hf_greedy_reference(model, PROMPTS[0], GREEDY.max_tokens)[0]
    llm = _spec(path, other_draft, max_concurrency=2, prefill_chunk=16)  # prompts in chunks, a queue
    assert [out.token_ids for out in llm.generate(None, GREEDY, PROMPTS)] == plain
    assert llm.scheduler.num_draft_tokens > 0  # drafts were made (and mostly refused: another model)


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
def test_a_draft_that_is_the_target_sees_its_drafts_accepted(target, plain, kv_dtype):
    _, path = target
    llm = _spec(path, path, kv_dtype=kv_dtype)
    got = [out.token_ids for out in llm.generate(None, GREEDY, PROMPTS)]
    if kv_dtype == "fp32":
        assert got == plain
    sched = llm.scheduler
    assert sched.num_draft_tokens >= 3 * len(PROMPTS) * 4  # k drafts a step
    assert sched.num_accepted_tokens >= 0.9 * sched.num_draft_tokens
    # the same prompts again start from the pages the first run left: the draft's KV came with them
    before = (sched.num_draft_tokens, sched.num_accepted_tokens)
    again = [out for out in llm.generate(None, GREEDY, PROMPTS)]
    assert [out.token_ids for out in again] == got
    assert all(out.num_cached_tokens > 0 for out, p in zip(again, PROMPTS) if len(p) > 8)  # a page or more
    drafted, accepted = sched.num_draft_tokens - before[0], sched.num_accepted_tokens - before[1]
    assert accepted >= 0.9 * drafted


def test_chained_drafts_through_the_graph_buffers(target, plain, other_draft):
    """The chained steps' CUDA-graph path (static buffers, a padding row, outputs reused across replays) run
    eagerly here: step by step the same drafts as the eager drafter's, and the target's output."""
    import torch
    from conftest import eager_replays

    from engine.spec.chain_graphs import draft_chain_graphs

    _, path = target
    eager, graphed = (_spec(path, other_draft, max_concurrency=4) for _ in range(2))
    max_blocks = -(-graphed.max_context // 8)
    chain = eager_replays(
        draft_chain_graphs(
            graphed.runner.drafter,
            4,
            max_blocks,
            torch.device("cpu"),
            torch.float32,
        )
    )
    graphed.runner.drafter.graphs = chain
    ids = [[llm.add_request(p, GREEDY) for p in PROMPTS] for llm in (eager, graphed)]
    requests = [graphed.scheduler.requests[rid] for rid in ids[1]]
    while eager.has_unfinished_requests():
        eager.step()
        graphed.step()
        want = [eager.scheduler.proposer._drafts.get(rid) for rid in ids[0]]
        assert [graphed.scheduler.proposer._drafts.get(rid) for rid in ids[1]] == want
    assert [r.output_token_ids for r in requests] == plain
    assert chain.replays >= 2 * (
        GREEDY.max_tokens // 4
    )  # k - 1 = 2 chained steps a step, 3 in the bucket of 4


def test_no_page_past_the_context_limit(target, other_draft, monkeypatch):
    """A request run up to the context limit: the drafter's chain takes no page past the limit's (on a GPU
    the decode graphs' block table is exactly that wide), and the output is still the target's."""
    _, path = target
    llm = _spec(path, other_draft, max_context=64)  # 8 pages of 8
    pages = []
    grow = llm.scheduler._grow

    def watched(req, num_tokens):
        done = grow(req, num_tokens)
        pages.append(len(req.block_ids))
        return done

    monkeypatch.setattr(llm.scheduler, "_grow", watched)
    prompt = [int(t) % 500 + 3 for t in range(7, 7 * 50, 7)]  # 49 tokens
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    (out,) = llm.generate(None, params, [prompt])
    (plain,) = LLM(path, block_size=8, max_context=64).generate(None, params, [prompt])
    assert len(prompt) + len(out.token_ids) == 64 and out.token_ids == plain.token_ids
    assert llm.scheduler.num_draft_tokens > 0 and max(pages) == 8


@pytest.mark.gpu
def test_draft_model_chain_on_cuda_with_graphs(target, other_draft):
    """On a GPU the draft model's chained steps replay their own graphs beside the decode graphs: the
    drafts made and the output equal the CPU's (fp32 both)."""
    _, path = target
    outs = {}
    for device in ("cpu", "cuda"):
        llm = _spec(path, other_draft, max_concurrency=4, device=device, dtype="float32")
        if device == "cuda":
            assert llm.runner.graphs is not None and llm.runner.drafter.graphs is not None
        outs[device] = [(o.token_ids, o.num_draft_tokens) for o in llm.generate(None, GREEDY, PROMPTS)]
    assert outs["cuda"] == outs["cpu"]


@pytest.mark.gpu
def test_raced_chains_on_cuda_with_graphs(target):
    """On a GPU a sampled request's chained drafts replay the raced graphs (penalty terms staged for one of
    them): a draft that is the target sees them accepted, and the output is the request's seeded tokens
    without drafts."""
    _, path = target
    sampled = SamplingParams(max_tokens=24, temperature=0.8, top_k=20, seed=11, ignore_eos=True)
    params = [sampled, GREEDY, dataclasses.replace(sampled, top_p=0.9, seed=3, presence_penalty=1.0)]
    cuda = dict(max_concurrency=4, device="cuda", dtype="float32")
    plain = [o.token_ids for o in LLM(path, **cuda).generate(None, params, PROMPTS)]
    llm = _spec(path, path, **cuda)
    assert llm.runner.drafter.graphs is not None
    assert [o.token_ids for o in llm.generate(None, params, PROMPTS)] == plain
    assert llm.scheduler.num_accepted_tokens >= 0.9 * llm.scheduler.num_draft_tokens


def test_a_prediction_drafts_before_the_draft_model(target, plain, other_draft):
    """Predicted Outputs under spec draft: the prediction's drafts (right, then edited) run where the draft
    model's would, and its KV still covers every token that stands: the output is the target's."""
    _, path = target
    llm = _spec(path, other_draft)
    prediction = plain[0][:10] + [1, 2, 3] + plain[0][16:]
    got = llm.generate(None, dataclasses.replace(GREEDY, prediction=prediction), PROMPTS[:1])[0]
    assert got.token_ids == plain[0]
    assert 0 < got.num_accepted_prediction_tokens < got.num_prediction_tokens


def test_preemptions_recompute_the_drafts_kv(target, plain):
    """A pool of 8 pages of 8 for three requests of up to 46 tokens: they preempt each other."""
    _, path = target
    llm = _spec(path, path, max_concurrency=3, kv_capacity=64, enable_prefix_caching=False)
    got = [out.token_ids for out in llm.generate(None, GREEDY, PROMPTS)]
    assert got == plain and llm.scheduler.num_preemptions > 0
    assert llm.scheduler.num_accepted_tokens >= 0.9 * llm.scheduler.num_draft_tokens


def test_what_cannot_draft_is_refused(target, tmp_path, monkeypatch):
    """Refused in a sentence; a draft that cannot draft for the target before any weights load (a 32B
    target takes minutes), its context limit once the pool is sized."""
    import engine.llm

    _, path = target
    loads = []
    load_model = engine.llm.load_model
    monkeypatch.setattr(engine.llm, "load_model", lambda *a, **k: loads.append(a) or load_model(*a, **k))
    with pytest.raises(NinferError, match="spec draft needs a draft model"):
        LLM(path, spec="draft")
    with pytest.raises(NinferError, match="drafts with spec draft .* add --spec draft"):
        LLM(path, draft_model=str(path))
    wider = save_tiny(tiny_hf_model("qwen3", tied=True, vocab_size=600), tmp_path / "wider")
    with pytest.raises(NinferError, match="has 600 token ids, the model 512"):
        _spec(path, wider)
    hybrid = save_tiny(tiny_hf_model("qwen3_5", tied=True), tmp_path / "hybrid")
    with pytest.raises(NinferError, match="is a hybrid .* a draft model is a plain decoder"):
        _spec(path, hybrid)
    assert loads == []
    short = save_tiny(tiny_hf_model("qwen3", tied=True, max_position_embeddings=64), tmp_path / "short")
    with pytest.raises(NinferError, match="draft model takes 64 positions, fewer than the context"):
        _spec(path, short)
    bare = tmp_path / "bare"
    save_tiny(tiny_hf_model("qwen3", tied=False).model, bare)
    assert json.loads((bare / "config.json").read_text())["architectures"] == ["Qwen3Model"]
    loads.clear()
    with pytest.raises(NinferError, match="has no LM head"):
        _spec(path, bare)
    assert loads == []


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
def test_the_ledger_counts_the_drafts_kv_in_every_pool_token(target, other_draft, kv_dtype):
    """What the runner allocates for a pool token, the target's layers and the draft model's, is what the
    memory ledger (and so --kv-capacity auto) charges for it."""
    from engine.memory import pool_bytes_per_token
    from engine.plan.runtime import deployment

    llm = _spec(target[1], other_draft, kv_dtype=kv_dtype, kv_capacity=64)
    caches = llm.runner.kv_caches
    assert len(caches) == llm.model_config.num_hidden_layers + llm.draft_model.config.num_hidden_layers
    allocated = sum(c.num_bytes for c in caches) // (llm.scheduler.block_pool.num_blocks * 8)
    dep = deployment(llm.engine_config, llm.model_config, 64, draft=llm.draft_model.config)
    assert pool_bytes_per_token(dep) == allocated
    alone = deployment(llm.engine_config, llm.model_config, 64)
    assert pool_bytes_per_token(alone) < allocated


def test_the_host_tier_carries_the_drafts_kv(target, plain):
    """A prefix evicted to host memory comes back with the draft model's KV: the drafts after it are
    accepted as before (a page copied back without the draft's part would leave its attention reading
    another request's KV)."""
    _, path = target
    small = dict(kv_capacity=48, max_context=48, max_concurrency=1, host_cache=1 << 20)
    llm = _spec(path, path, **small)  # 6 pages of 8
    a, b = PROMPTS[0], PROMPTS[2]  # 22 and 18 tokens, 24 generated: b's pages take a's
    first = llm.generate(None, GREEDY, [a])[0]
    llm.generate(None, GREEDY, [b])
    sched = llm.scheduler
    before = (sched.num_draft_tokens, sched.num_accepted_tokens)
    again = llm.generate(None, GREEDY, [a])[0]
    assert again.num_cached_tokens == 16 and again.token_ids == first.token_ids == plain[0]
    drafted, accepted = sched.num_draft_tokens - before[0], sched.num_accepted_tokens - before[1]
    assert drafted > 0 and accepted >= 0.9 * drafted


def test_a_sampled_request_races_its_drafts(target):
    """A sampled request's drafts are the draft model's winners of the race the sampler runs at their
    positions (engine/sample/race.py): a draft that is the target sees them accepted as a greedy request's
    are, where argmax drafts are accepted only as often as the target draws its argmax; the output is the
    request's seeded tokens without drafts either way."""
    _, path = target
    sampled = SamplingParams(max_tokens=24, temperature=1.0, seed=11, ignore_eos=True)
    mixed = [sampled, GREEDY, dataclasses.replace(sampled, temperature=0.6, top_k=20, top_p=0.9, seed=12)]
    want = [o.token_ids for o in LLM(path, max_concurrency=2).generate(None, mixed[:2], PROMPTS[:2])]
    rates = {}
    for raced in (True, False):
        llm = _spec(path, path, max_concurrency=3)
        if not raced:
            llm.runner.drafter.races = None  # the draft model's argmax, as before races
        got = llm.generate(None, mixed, PROMPTS)
        assert [o.token_ids for o in got[:2]] == want
        sched = llm.scheduler
        rates[raced] = sched.num_accepted_tokens / sched.num_draft_tokens
    assert rates[True] >= 0.95 > 0.5 > rates[False], rates


def test_raced_chains_through_the_graph_buffers(target):
    """Sampled (penalized) and greedy requests chaining together through the graph buffers (eagerly, a
    padding row): the eager drafter's drafts step by step."""
    import torch
    from conftest import eager_replays

    from engine.spec.chain_graphs import draft_chain_graphs

    _, path = target
    eager, graphed = (_spec(path, path, max_concurrency=4) for _ in range(2))
    chain = draft_chain_graphs(graphed.runner.drafter, 4, -(-graphed.max_context // 8), "cpu", torch.float32)
    graphed.runner.drafter.graphs = eager_replays(chain)
    params = [
        SamplingParams(max_tokens=16, temperature=t, seed=5, ignore_eos=True, **penalties)
        for t, penalties in ((0.8, {"presence_penalty": 1.0}), (0.0, {}), (1.2, {"repetition_penalty": 1.3}))
    ]
    ids = [[llm.add_request(p, q) for p, q in zip(PROMPTS, params)] for llm in (eager, graphed)]
    while eager.has_unfinished_requests():
        eager.step()
        graphed.step()
        want = [eager.scheduler.proposer._drafts.get(rid) for rid in ids[0]]
        assert [graphed.scheduler.proposer._drafts.get(rid) for rid in ids[1]] == want
    assert chain.replays > 0
    assert graphed.scheduler.num_accepted_tokens >= 0.9 * graphed.scheduler.num_draft_tokens


@pytest.mark.parametrize(
    "penalties",
    [
        {"presence_penalty": 1.5},
        {"repetition_penalty": 1.2, "frequency_penalty": 0.4},
        {"repeat_last_n": 8, "repetition_penalty": 1.3, "presence_penalty": 0.5},
    ],
    ids=["presence", "repetition-frequency", "window"],
)
def test_penalized_requests_draft_as_the_sampler_penalizes(target, penalties):
    """A request with penalties drafts from the drafter's logits penalized as the sampler penalizes the
    model's (engine/spec/race.penalty_terms, read off the sampler's own penalize): a draft that is the
    target sees them kept, sampled or greedy, and the output is the request's without drafts."""
    _, path = target
    params = [
        SamplingParams(max_tokens=24, temperature=t, seed=7, ignore_eos=True, **penalties) for t in (1.0, 0)
    ]
    want = [o.token_ids for o in LLM(path, max_concurrency=2).generate(None, params, PROMPTS[:2])]
    llm = _spec(path, path, max_concurrency=2)
    assert [o.token_ids for o in llm.generate(None, params, PROMPTS[:2])] == want
    assert llm.scheduler.num_accepted_tokens >= 0.95 * llm.scheduler.num_draft_tokens
