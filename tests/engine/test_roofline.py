"""bench's roofline: the bytes and FLOPs a decode step and a prompt token cost, and a row's share of the
device's peaks (engine/bench/roofline.py, suite.summarise)."""

from __future__ import annotations

import pytest
from conftest import rope_model_config

from engine.bench.drivers import Timing
from engine.bench.roofline import DrafterCost, ModelCost, Peaks, roofline
from engine.bench.suite import request_record, summarise
from engine.config import ModelConfig
from engine.memory import routed_share

PEAKS = Peaks(1e12, 1e15, "given")


def _config(**moe) -> ModelConfig:
    return rope_model_config(architecture="Qwen3ForCausalLM", **moe)


def _record(chunk_times: list[float], spec: float | None, stream: int = 0) -> dict:
    t = Timing(512, 0, len(chunk_times), 0.0, chunk_times[0], chunk_times[-1], chunk_times, spec)
    record = request_record(t, 512)
    return {**record, "scenario": "random", "context": 512, "concurrency": 1, "repeat": stream, "stream": 0}


def test_a_speculative_step_reads_the_weights_once_for_its_tokens():
    """tg 400 tokens/s at 4 tokens a step is 100 steps/s: the decode % of 100 plain steps. A run without
    drafts is one token a step even where tokens arrive together (a detokenizer holding some back)."""
    cost = ModelCost(_config(), 10**9, 10**9, "bf16")
    plain = roofline(cost, PEAKS, 0, 0, 100.0)["decode_pct"]
    assert plain == pytest.approx(10.0)  # 1e9 bytes x 100 steps/s of 1e12 B/s
    assert roofline(cost, PEAKS, 0, 0, 400.0, tokens_per_step=4.0)["decode_pct"] == pytest.approx(plain)
    steps = [0.1 * i for i in range(1, 4) for _ in range(4)]  # 3 steps of 4 tokens
    times = [0.0, *steps]  # the first token, then 12 more in 3 steps
    drafted = _record(times, spec=0.75)
    assert drafted["tokens_per_step"] == pytest.approx(4.0)
    [row] = summarise([drafted], cost, PEAKS)
    tg = row["tg"]["median"]
    assert row["roofline"]["decode_pct"] == pytest.approx(1e9 * tg / 4 / 1e12 * 100)
    from rich.console import Console

    from engine.bench.report import run_table

    console = Console(record=True, width=250)
    console.print(run_table({"label": "x", "config": {"repeat": 1}, "rows": [row]}))
    text = console.export_text()
    assert "tok/step" in text and " 4.00 " in text and " 75 " in text  # beside the acceptance
    [row] = summarise([_record(times, spec=None)], cost, PEAKS)  # no drafts: a step a token
    assert row["roofline"]["decode_pct"] == pytest.approx(1e9 * tg / 1e12 * 100)


def test_a_mixture_of_experts_reads_the_experts_its_tokens_route_to():
    cfg = _config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    assert routed_share(cfg, 1) == pytest.approx(0.25)
    assert routed_share(cfg, 2) == pytest.approx(1 - 0.75**2)
    assert routed_share(_config(), 3) == 1.0
    cost = ModelCost(cfg, 1000, 0, "bf16", expert_bytes=8000)
    assert cost.decode_bytes(0) == pytest.approx(1000 + 2000)
    assert cost.decode_bytes(0, streams=2) == pytest.approx(1000 + 8000 * (1 - 0.75**2))
    # four tokens a step (a draft of three accepted) route among the experts as four streams' do
    four = roofline(cost, PEAKS, 0, 0, 4.0, tokens_per_step=4.0)["decode_pct"]
    assert four == pytest.approx((1000 + 8000 * (1 - 0.75**4)) / 1e12 * 100)
    # with a drafter of three drafts a step, the step verifies four tokens whatever it accepts of them
    drafter = DrafterCost(cfg, 3, 0, 0)
    drafted = ModelCost(cfg, 1000, 0, "bf16", expert_bytes=8000, drafter=drafter)
    two = roofline(drafted, PEAKS, 0, 0, 2.0, tokens_per_step=2.0)["decode_pct"]
    assert two == pytest.approx(four)


def test_plan_weighs_a_mixture_of_experts_by_what_a_step_reads():
    """plan's speed tie-break (solver.decode_bytes) reads the experts a step's tokens route to."""
    from engine.memory import Deployment, pool_bytes_per_token
    from engine.plan.solver import decode_bytes

    cfg = _config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    weights = {"attention": 1000, "experts": 8000}
    dep = Deployment(cfg, "bf16", 256, concurrency=2, weights=weights)
    kv = 2 * 256 * pool_bytes_per_token(dep)
    assert decode_bytes(dep) == pytest.approx(1000 + 8000 * (1 - 0.75**2) + kv)


def test_in_process_timing_takes_a_speculative_step_as_one_chunk():
    """In process, a step's tokens arrive as one chunk (ITL between steps, as over HTTP): a drafted run's
    chunks are fewer than its tokens, and its tokens per step are the tokens over those chunks."""
    from engine import LLM
    from engine.bench.drivers import InProcess
    from engine.bench.workloads import build

    driver = InProcess(LLM(spec="ngram", draft_tokens=3))
    # a fixed nonce: how much of the continuation the drafts guess depends on the prompt (21 steps for 48
    # tokens with this one; a random nonce gave 21-42, now and then past the bound below)
    prompt = build("random", 200, driver.count, seed=3, nonce="5a5a5a5a5a5a")
    [t] = driver.run([prompt], 48, 0.0)
    assert t.generated == 48 and len(t.chunk_times) == len(set(t.chunk_times)) < 40  # (drafts taken)
    record = request_record(t, 200)
    assert record["tokens_per_step"] == pytest.approx(47 / (len(t.chunk_times) - 1))
    assert record["tokens_per_step"] == pytest.approx(47 / (47 - t.spec_accepted))  # a step a chunk


def test_tokens_per_step_from_a_servers_accepted_count():
    """llama-server streams a token an event, drafted or not, and says how many drafts it accepted: a step
    gives one token and its accepted drafts."""
    times = [0.01 * i for i in range(41)]  # 41 tokens, each its own event
    t = Timing(512, 0, 41, 0.0, times[0], times[-1], times, 0.75, spec_accepted=30)
    assert request_record(t, 512)["tokens_per_step"] == pytest.approx(40 / 10)
    no_count = Timing(512, 0, 41, 0.0, times[0], times[-1], times, 0.75)
    assert request_record(no_count, 512)["tokens_per_step"] == pytest.approx(1.0)  # (what the stream shows)
    gaps = [b - a for a, b in zip(t.chunk_times, t.chunk_times[1:])]
    assert min(gaps) > 0


def test_a_speculative_step_counts_its_drafters_reads(tmp_path):
    """spec mtp: each of a step's drafts runs the MTP layer and the head it drafts through (the whole
    lm_head, or --lm-head-draft's rows) over every stream's context; spec draft: the draft model. The model's
    own step counts neither (a draft head, rows of lm_head, was counted again before)."""
    from conftest import mtp_head_tensors, save_mtp_head, save_tiny, tiny_hf_model

    from engine import LLM
    from engine.bench.roofline import cost_of_llm
    from engine.memory import bytes_per_token_per_layer, kv_bytes_per_token

    model = tiny_hf_model("qwen3_5", tied=False)
    path = save_tiny(model, tmp_path)
    head = mtp_head_tensors(model)
    save_mtp_head(path, head)
    plain = cost_of_llm(LLM(path))
    assert plain.drafter is None and cost_of_llm(LLM(path, spec="ngram", draft_tokens=3)).drafter is None
    mtp = cost_of_llm(LLM(path, spec="mtp", draft_tokens=3))
    narrow = cost_of_llm(LLM(path, spec="mtp", draft_tokens=3, lm_head_draft=64))
    cfg = plain.config
    assert mtp.weight_bytes == narrow.weight_bytes == plain.weight_bytes
    lm_head = cfg.vocab_size * cfg.hidden_size * 4
    head_bytes = sum(t.numel() for t in head.values()) * 4
    drafter = mtp.drafter
    assert drafter.passes == 3 and drafter.weight_bytes == head_bytes + lm_head
    assert narrow.drafter.weight_bytes == head_bytes + 64 * cfg.hidden_size * 4
    kv = bytes_per_token_per_layer(mtp.kv_dtype, cfg.num_key_value_heads, cfg.head_dim)
    assert drafter.kv_per_token == kv
    want = plain.decode_bytes(1000, 2) + 3 * (drafter.weight_bytes + 2 * 1000 * kv)
    assert mtp.decode_bytes(1000, 2) == pytest.approx(want)
    # a draft model (here a plain decoder drafting for itself): its whole step, a pass a draft token
    dense = save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path / "dense")
    alone = cost_of_llm(LLM(dense))
    drafted = cost_of_llm(LLM(dense, spec="draft", draft_model=str(dense), draft_tokens=2))
    assert drafted.weight_bytes == alone.weight_bytes
    assert drafted.drafter.passes == 2 and drafted.drafter.weight_bytes == alone.weight_bytes
    assert drafted.drafter.kv_per_token == kv_bytes_per_token(alone.config, alone.kv_dtype)
