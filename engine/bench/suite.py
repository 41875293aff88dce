"""The benchmark loop: for each context x concurrency x repeat, fresh prompts (new nonces), one timed batch,
one record per request; then rows with min / median / max over repeats (docs/benchmarks.md, methodology).

Per request: TTFT = first token - start; pp = prompt tokens / TTFT; tg = (generated - 1) / (last - first);
inter-token latency p50 / p99 from the streamed chunks; cached tokens (any in a cold run: INVALID; none
reported by the server or its /metrics: UNPROVEN).
Concurrency above 1: per-stream rows, and aggregate rows per repeat (sum of the streams' decoded tokens over
the window from the first first-token to the last token; sum of prompt tokens over the slowest TTFT).

Agent turns (`turns` > 1, the agent scenario): each conversation's later requests (engine/bench/workloads.py
next_turn: a tool call and its result, TURN_TOKENS more) follow its cold first one; their rows (by turn)
give TTFT and the prompt tokens the server took from its prefix cache (cached tokens expected there: pp,
counted over a cached prompt, is left out). With `subagent_turns` K, each run then sends K turns of another
agent conversation (a subagent's: cold, then a turn more each, scenario "subagent" in the rows) while the
agent's waits, as Claude Code's Task tool does, and then the agent's next turn: its row (turn N + 1,
`after_subagent_turns`) shows whether the server kept the agent's prefix through the subagent's turns (its
TTFT as turn N's) or computes it again.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from engine.bench.drivers import Timing
from engine.bench.roofline import ModelCost, Peaks, roofline
from engine.bench.telemetry import Telemetry
from engine.bench.workloads import build, next_turn

WARMUP_TOKENS, WARMUP_GEN = 128, 8
UNPROVEN = (
    "the server reported no cached tokens and has no prefix-cache counter, so a warm cache is not ruled out "
    "(vLLM: serve it with --enable-prompt-tokens-details)"
)


WOKE = (
    "the server was asleep when a run began and a request before it did not wake it, so its first token waited "
    "for the wake; give the server a longer --sleep-idle-seconds (or none) while it is measured"
)


@dataclass(frozen=True)
class BenchConfig:
    contexts: tuple[int, ...]
    concurrencies: tuple[int, ...]
    scenario: str = "random"
    gen: int = 256
    repeat: int = 3
    temperature: float = 0.0  # 0: greedy; above: each request sampled, seeded by its stream
    turns: int = 1  # requests per conversation (agent): the cold first, then each with a turn more
    subagent_turns: int = 0  # then a subagent conversation's turns, then the agent's turn turns + 1


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def request_record(t: Timing, target: int) -> dict:
    ttft = t.t_first - t.t_start
    window = t.t_last - t.t_first
    gaps = [b - a for a, b in zip(t.chunk_times, t.chunk_times[1:])]
    return {
        "target_tokens": target,
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "cache_proof": t.cache_proof,
        "woke": t.woke,
        "generated": t.generated,
        "ttft_s": ttft,
        "pp": t.prompt_tokens / ttft if ttft > 0 else None,
        "tg": (t.generated - 1) / window if window > 0 and t.generated > 1 else None,
        "itl_p50_ms": (_percentile(gaps, 0.5) or 0) * 1000 if gaps else None,
        "itl_p99_ms": (_percentile(gaps, 0.99) or 0) * 1000 if gaps else None,
        "t_start": t.t_start,
        "t_first": t.t_first,
        "t_last": t.t_last,
        "spec_acceptance": t.spec_acceptance,
        "tokens_per_step": tokens_per_step(t),
        "error": t.error,
    }


def tokens_per_step(t: Timing) -> float | None:
    """Tokens a decode step gave this request, after its first: each step gives one and the draft tokens it
    accepted, where the request's accepted count is reported (in process, llama-server's timings); else
    over the steps that streamed them (chunk arrivals: vLLM and ninfer send a step's tokens as one). None
    for a request of one step."""
    decoded = t.generated - 1
    if t.spec_accepted is not None and decoded > t.spec_accepted:
        return decoded / (decoded - t.spec_accepted)
    steps = len(set(t.chunk_times))
    return decoded / (steps - 1) if steps > 1 and decoded > 0 else None


def run_suite(
    driver,
    cfg: BenchConfig,
    telemetry: Telemetry,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Every request's record (with its context, concurrency, repeat, stream and telemetry windows)."""
    shortest = min(cfg.contexts)
    warm = build(cfg.scenario, min(shortest, max(WARMUP_TOKENS, shortest // 8)), driver.count)
    driver.run([warm], min(WARMUP_GEN, cfg.gen), cfg.temperature)
    records = []
    seed = 0
    for ctx in cfg.contexts:
        for c in cfg.concurrencies:
            for r in range(cfg.repeat):
                if progress:
                    progress(f"{cfg.scenario} ctx {ctx} C{c} repeat {r + 1}/{cfg.repeat}")
                where = {"context": ctx, "concurrency": c, "repeat": r}
                started = {}
                for scenario, turns in ((cfg.scenario, cfg.turns), ("subagent", cfg.subagent_turns)):
                    prompts = []
                    for _ in range(c if turns else 0):
                        seed += 1
                        prompts.append(build(cfg.scenario, ctx, driver.count, seed=seed))
                    for turn in range(1, turns + 1):
                        if turn > 1:
                            prompts = [next_turn(p, turn, driver.count) for p in prompts]
                        records += _send(
                            driver, cfg, telemetry, prompts, {**where, "scenario": scenario, "turn": turn}
                        )
                    started[scenario] = prompts
                if cfg.subagent_turns:  # the agent's turn after its subagent's
                    turn = cfg.turns + 1
                    prompts = [next_turn(p, turn, driver.count) for p in started[cfg.scenario]]
                    fields = {
                        **where,
                        "scenario": cfg.scenario,
                        "turn": turn,
                        "after_subagent_turns": cfg.subagent_turns,
                    }
                    records += _send(driver, cfg, telemetry, prompts, fields)
    return records


def _send(driver, cfg: BenchConfig, telemetry: Telemetry, prompts: list, fields: dict) -> list[dict]:
    """One timed batch (a request a stream): each request's record with `fields` (its context, concurrency,
    repeat, scenario, turn) and its stream, and the GPU telemetry of its prefill and decode windows."""
    records = []
    for stream, t in enumerate(driver.run(prompts, cfg.gen, cfg.temperature)):
        rec = {**request_record(t, prompts[stream].tokens), **fields, "stream": stream}
        rec["telemetry_prefill"] = telemetry.window(t.t_start, t.t_first)
        rec["telemetry_decode"] = telemetry.window(t.t_first, t.t_last)
        records.append(rec)
    return records


def _stats(values: list[float | None]) -> dict | None:
    got = [v for v in values if v is not None]
    if not got:
        return None
    return {"min": min(got), "median": statistics.median(got), "max": max(got)}


def summarise(records: list[dict], cost: ModelCost | None, peaks: Peaks) -> list[dict]:
    """One row per (scenario, context, concurrency, turn, kind): kind C1, or per-stream and aggregate above
    C1; turn 1 (the cold request) unless the run went on with agent turns."""
    rows = []

    def key(r: dict) -> tuple:
        return r["scenario"], r["context"], r["concurrency"], r.get("turn", 1)

    for scenario, ctx, c, turn in sorted({key(r) for r in records}):
        group = [r for r in records if key(r) == (scenario, ctx, c, turn)]
        if turn > 1:
            rows.append(_warm_row(group, cost, peaks))
            continue
        cached = sum(r["cached_tokens"] or 0 for r in group)
        unproven = any(r.get("cache_proof", "response") is None for r in group)
        errors = [r["error"] for r in group if r["error"]]
        woke = any(r.get("woke") for r in group)
        off = sorted({r["prompt_tokens"] - r["target_tokens"] for r in group} - {0})
        status = "ok"
        if cached:
            status = f"INVALID: {cached} cached tokens in a cold run"
        elif errors:
            status = f"INVALID: {errors[0]}"
        elif woke:
            status = f"INVALID: {WOKE}"
        elif unproven:
            status = f"UNPROVEN: {UNPROVEN}"
        base = {
            "scenario": scenario,
            "context": ctx,
            "concurrency": c,
            "turn": turn,
            "status": status,
            "prompt_off_by": off,
        }
        per = {
            "pp": _stats([r["pp"] for r in group]),
            "tg": _stats([r["tg"] for r in group]),
            "ttft_s": _stats([r["ttft_s"] for r in group]),
            "itl_p50_ms": _stats([r["itl_p50_ms"] for r in group]),
            "itl_p99_ms": _stats([r["itl_p99_ms"] for r in group]),
            "spec_acceptance": _stats([r.get("spec_acceptance") for r in group]),
            "tokens_per_step": _stats([r.get("tokens_per_step") for r in group]),
        }
        per["telemetry"] = _telemetry(group)
        rows.append({**base, "kind": "stream" if c > 1 else "C1", **per, **_roof(cost, peaks, ctx, per)})
        if c > 1:
            agg_pp, agg_tg = [], []
            for rep in sorted({r["repeat"] for r in group}):
                batch = [r for r in group if r["repeat"] == rep]
                t0 = min(r["t_start"] for r in batch)
                slowest = max(r["t_first"] for r in batch) - t0
                window = max(r["t_last"] for r in batch) - min(r["t_first"] for r in batch)
                agg_pp.append(sum(r["prompt_tokens"] for r in batch) / slowest if slowest > 0 else None)
                agg_tg.append(sum(r["generated"] - 1 for r in batch) / window if window > 0 else None)
            agg = {"pp": _stats(agg_pp), "tg": _stats(agg_tg)}
            agg |= {k: per[k] for k in ("spec_acceptance", "tokens_per_step")}  # (for the roofline)
            rows.append({**base, "kind": "aggregate", **agg, **_roof(cost, peaks, ctx, agg, streams=c)})
    return rows


def _warm_row(group: list[dict], cost: ModelCost | None, peaks: Peaks) -> dict:
    """A later agent turn's row (its streams together): TTFT and the prompt tokens taken from the prefix
    cache (the point of the turn: cached tokens are no fault here; none reported: the row says so)."""
    first = group[0]
    errors = [r["error"] for r in group if r["error"]]
    unreported = any(r["cached_tokens"] is None for r in group)
    status = "ok"
    if errors:
        status = f"INVALID: {errors[0]}"
    elif any(r.get("woke") for r in group):
        status = f"INVALID: {WOKE}"
    elif unreported:
        status = "the server reported no cached tokens for this turn (vLLM: --enable-prompt-tokens-details)"
    per = {
        "tg": _stats([r["tg"] for r in group]),
        "ttft_s": _stats([r["ttft_s"] for r in group]),
        "itl_p50_ms": _stats([r["itl_p50_ms"] for r in group]),
        "itl_p99_ms": _stats([r["itl_p99_ms"] for r in group]),
        "spec_acceptance": _stats([r.get("spec_acceptance") for r in group]),
        "tokens_per_step": _stats([r.get("tokens_per_step") for r in group]),
        "prompt_tokens": _stats([r["prompt_tokens"] for r in group]),
        "cached_tokens": None if unreported else _stats([r["cached_tokens"] for r in group]),
    }
    per["telemetry"] = _telemetry(group)
    kind = "C1" if first["concurrency"] == 1 else "stream"
    return {
        "scenario": first["scenario"],
        "context": first["context"],
        "concurrency": first["concurrency"],
        "turn": first["turn"],
        "after_subagent_turns": first.get("after_subagent_turns", 0),
        "status": status,
        "prompt_off_by": [],
        "kind": kind,
        **per,
        # (decode at the turn's depth)
        **_roof(cost, peaks, int(per["prompt_tokens"]["median"]), per),
    }


def _telemetry(group: list[dict]) -> dict | None:
    """The decode windows' GPU telemetry of a row: power, clocks, temperature, PCIe (None without a GPU)."""
    windows = [r["telemetry_decode"] for r in group if r.get("telemetry_decode")]
    if not windows:
        return None
    return {
        "power_avg_w": statistics.median(w["power_avg_w"] for w in windows),
        "power_max_w": max(w["power_max_w"] for w in windows),
        "sm_mhz_avg": statistics.median(w["sm_mhz_avg"] for w in windows),
        "sm_mhz_min": min(w["sm_mhz_min"] for w in windows),
        "mem_mhz_avg": statistics.median(w["mem_mhz_avg"] for w in windows),
        "temp_c_max": max(w["temp_c_max"] for w in windows),
        "util_gpu_avg": statistics.median(w["util_gpu_avg"] for w in windows),
        "pcie_rx_avg": statistics.median(w["pcie_rx_avg"] for w in windows),
        "pcie_tx_avg": statistics.median(w["pcie_tx_avg"] for w in windows),
        "pcie_spill": any(w["pcie_spill"] for w in windows),
    }


def _roof(cost, peaks, ctx, stats, streams: int = 1) -> dict:
    """The row's roofline %: a speculative run's decode steps are its tokens over its tokens per step."""
    pp = (stats.get("pp") or {}).get("median")
    tg = (stats.get("tg") or {}).get("median")
    spec = (stats.get("spec_acceptance") or {}).get("median") is not None
    per_step = (stats.get("tokens_per_step") or {}).get("median") if spec else None
    return {"roofline": roofline(cost, peaks, ctx, pp or 0, tg or 0, streams, per_step or 1.0)}
