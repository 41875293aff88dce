"""Benchmark output: the rich table of a run, and `compare` of two runs with ratios and crossover contexts."""

from __future__ import annotations

import math

METRICS = ("pp", "tg")
WARM_METRICS = ("tg", "ttft_s")  # an agent run's later turns: TTFT (lower is better) in place of pp
LABELS = {"pp": "pp tok/s", "tg": "tg tok/s", "ttft_s": "TTFT s"}
SHORT = {"pp": "pp", "tg": "tg", "ttft_s": "TTFT"}


def _med(stats: dict | None) -> float | None:
    return stats["median"] if stats else None


def _cell(stats: dict | None, digits: int = 1) -> str:
    if not stats:
        return "-"
    d = 0 if stats["median"] >= 100 else digits
    return f"{stats['median']:.{d}f} ({stats['min']:.{d}f}-{stats['max']:.{d}f})"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _sampling(config: dict) -> str:
    """How a run's requests drew their tokens (a file from before --temperature ran greedy)."""
    temperature = config.get("temperature", 0.0)
    return "greedy" if not temperature else f"sampled at temperature {temperature:g}, seeded"


def run_table(result: dict):
    from rich.table import Table

    config = result["config"]
    t = Table(
        title=f"ninfer bench: {result['label']}  ({_sampling(config)}; median (min-max) over "
        f"{config['repeat']} repeats)"
    )
    turns = any(row.get("turn", 1) > 1 for row in result["rows"])
    for col, justify in [
        ("scenario", "left"),
        ("ctx", "right"),
        ("C", "right"),
        *([("turn", "right"), ("cached / prompt", "right")] if turns else []),
        ("kind", "left"),
        ("pp tok/s", "right"),
        ("tg tok/s", "right"),
        ("TTFT s", "right"),
        ("ITL p50/p99 ms", "right"),
        ("decode %BW", "right"),
        ("prefill %peak", "right"),
        ("status", "left"),
    ]:
        t.add_column(col, justify=justify, no_wrap=col == "turn")
    spec = any(row.get("spec_acceptance") for row in result["rows"])
    if spec:
        t.add_column("draft accept %", justify="right")
        t.add_column("tok/step", justify="right")  # (a step's tokens: its accepted drafts and one)
    gpu = any(row.get("telemetry") for row in result["rows"])
    if gpu:
        t.add_column("decode W avg/max", justify="right")
        t.add_column("SM MHz avg/min", justify="right")
    for row in result["rows"]:
        p50, p99 = _med(row.get("itl_p50_ms")), _med(row.get("itl_p99_ms"))
        itl = "-" if p50 is None else f"{p50:.1f} / {p99:.1f}"
        status = row["status"]
        roof = row.get("roofline") or {}
        tel = row.get("telemetry")
        extra = []
        if spec:
            accept, per_step = _med(row.get("spec_acceptance")), _med(row.get("tokens_per_step"))
            extra.append("-" if accept is None else f"{accept * 100:.0f}")
            extra.append("-" if per_step is None or accept is None else f"{per_step:.2f}")
        if gpu:
            extra += (
                ["-", "-"]
                if not tel
                else [
                    f"{tel['power_avg_w']:.0f} / {tel['power_max_w']:.0f}",
                    f"{tel['sm_mhz_avg']:.0f} / {tel['sm_mhz_min']:.0f}",
                ]
            )
        if tel and tel["pcie_spill"] and status == "ok":
            status = "[yellow]PCIe busy in decode: KV or weights spilling to host?[/]"
        elif status.startswith("UNPROVEN"):
            status = "[yellow]UNPROVEN: cold cache not shown (no cached_tokens, no /metrics counter)[/]"
        t.add_row(
            row["scenario"],
            f"{row['context']:,}",
            str(row["concurrency"]),
            *(
                [_turn_label(row.get("turn", 1), row.get("after_subagent_turns", 0)), _cached(row)]
                if turns
                else []
            ),
            row["kind"],
            _cell(row.get("pp")),
            _cell(row.get("tg")),
            _cell(row.get("ttft_s"), 2),
            itl,
            _pct(roof.get("decode_pct")),
            _pct(roof.get("prefill_pct")),
            f"[bold red]{status}[/]" if status.startswith("INVALID") else status,
            *extra,
        )
    return t


def _turn_label(turn: int, after_subagent_turns: int = 0) -> str:
    """A row's turn: its number, and for the agent's turn after its subagent's, how many those were."""
    return f"{turn} (after {after_subagent_turns} subagent)" if after_subagent_turns else str(turn)


def _cached(row: dict) -> str:
    """A later agent turn's cached and prompt tokens (medians); "-" for a cold row."""
    if row.get("turn", 1) == 1:
        return "-"
    cached, prompt = _med(row.get("cached_tokens")), _med(row.get("prompt_tokens"))
    return f"? / {prompt:,.0f}" if cached is None else f"{cached:,.0f} / {prompt:,.0f}"


def compare(a: dict, b: dict) -> tuple[list[dict], list[dict]]:
    """Side-by-side rows (A, B, B/A per metric and context) and the crossovers: where B's curve crosses A's
    (for TTFT, lower is better: the side whose TTFT falls below the other's overtakes)."""

    def index(result):
        # (the agent's turn after its subagent's is a series of its own: a run without subagent turns has
        # none to set beside it)
        return {
            (_scenario(r), r["concurrency"], r["kind"], r.get("turn", 1), r["context"]): r
            for r in result["rows"]
        }

    ia, ib = index(a), index(b)
    series = sorted({k[:4] for k in ia} & {k[:4] for k in ib})
    rows, crossovers = [], []
    for key in series:
        contexts = sorted({k[4] for k in ia if k[:4] == key} & {k[4] for k in ib if k[:4] == key})
        for metric in METRICS if key[3] == 1 else WARM_METRICS:
            points = []
            for ctx in contexts:
                va, vb = _med(ia[(*key, ctx)].get(metric)), _med(ib[(*key, ctx)].get(metric))
                rows.append(
                    {
                        "series": key,
                        "metric": metric,
                        "context": ctx,
                        "a": va,
                        "b": vb,
                        "ratio": vb / va if va and vb is not None else None,
                    }
                )
                if va is not None and vb is not None:
                    points.append((ctx, (vb - va) if metric != "ttft_s" else (va - vb)))  # B ahead: > 0
            crossovers += _crossings(key, metric, points)
    return rows, crossovers


def _scenario(row: dict) -> str:
    after = row.get("after_subagent_turns", 0)
    return f"{row['scenario']} after {after} subagent turns" if after else row["scenario"]


def _crossings(key, metric, points: list[tuple[int, float]]) -> list[dict]:
    out = []
    for (c1, d1), (c2, d2) in zip(points, points[1:]):
        if d1 == 0 or (d1 < 0) == (d2 < 0):
            continue
        # linear in log(context) between the two measured contexts
        x = math.log(c1) + (math.log(c2) - math.log(c1)) * d1 / (d1 - d2)
        out.append(
            {
                "series": key,
                "metric": metric,
                "between": (c1, c2),
                "context": round(math.exp(x)),
                "overtakes": "B" if d2 > 0 else "A",
            }
        )
    return out


def _series(key: tuple) -> str:
    scenario, c, kind, turn = key
    return f"{scenario}, C{c} {kind}" + (f", turn {turn}" if turn > 1 else "")


def compare_tables(a: dict, b: dict):
    from rich.table import Table

    rows, crossovers = compare(a, b)
    turns = any(r["series"][3] > 1 for r in rows)
    t = Table(title=f"A = {a['label']}   B = {b['label']}")
    columns = ("scenario", "C", *(("turn",) if turns else ()), "kind", "metric", "ctx", "A", "B", "B/A")
    for col in columns:
        t.add_column(col, justify="left" if col in ("scenario", "kind", "metric") else "right")
    for r in rows:
        scenario, c, kind, turn = r["series"]
        digits = 2 if r["metric"] == "ttft_s" else 1
        fmt = lambda v, d=digits: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        t.add_row(
            scenario,
            str(c),
            *((str(turn),) if turns else ()),
            kind,
            LABELS[r["metric"]],
            f"{r['context']:,}",
            fmt(r["a"]),
            fmt(r["b"]),
            "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
        )
    lines = [
        f"{SHORT[x['metric']]} ({_series(x['series'])}): {x['overtakes']} overtakes near {x['context']:,} "
        f"tokens (between {x['between'][0]:,} and {x['between'][1]:,})"
        for x in crossovers
    ] or ["no crossover: one side leads at every common context"]
    if _sampling(a["config"]) != _sampling(b["config"]):
        lines.append(
            f"A ran {_sampling(a['config'])}, B {_sampling(b['config'])}: speculative decoding's acceptance "
            "and so tg depend on it; compare runs that sample alike"
        )
    return t, lines
