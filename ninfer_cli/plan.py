"""`ninfer plan`: will it fit, and how — the VRAM ledger, the frontier, and the serve line that fits."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from engine.plan.presets import PRESETS
from engine.sizes import parse_size
from ninfer_cli.errors import exits_cleanly
from ninfer_cli.int8_option import Int8Prefill
from ninfer_cli.model_options import RopeScaling, StateSnapshots
from ninfer_cli.vision_option import Mmproj, Vision

GIB = 1 << 30


@exits_cleanly
def plan(
    model: Annotated[
        str | None, typer.Argument(help=".ninfer, HF directory, config.json, .gguf, or a preset name.")
    ] = None,
    preset_name: Annotated[
        str | None,
        typer.Option(
            "--model",
            help=f"A preset: {', '.join(PRESETS)}.",
        ),
    ] = None,
    vram: Annotated[str | None, typer.Option(help="GPU memory, e.g. 24G (default: the local GPU).")] = None,
    sm: Annotated[str | None, typer.Option(help="Compute capability, e.g. 86 (RTX 3090), 89, 90.")] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Requests running at once (default: 1, or with --context the most, up to 4, that fit)."
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option(help="Target context, e.g. 180k (default: the most that fits).")
    ] = None,
    kv_dtype: Annotated[str, typer.Option(help="auto, bf16, fp16, fp8, int8, k8v4 (rk8v4).")] = "auto",
    spec: Annotated[str, typer.Option(help="Speculative decoding: none, mtp, ngram, draft.")] = "none",
    draft_tokens: Annotated[int, typer.Option(help="Draft tokens per step with --spec.")] = 3,
    draft_model: Annotated[
        str | None,
        typer.Option(
            help="With --spec draft: the draft model (path or preset, e.g. qwen3-0.6b); its weights and KV "
            "are in the ledger."
        ),
    ] = None,
    vision: Vision = False,
    mmproj: Mmproj = None,
    int8_prefill: Int8Prefill = False,
    recipe: Annotated[
        str | None,
        typer.Option(help="Weights as q4.6, w4g128, w6g128, w8g128 or bf16 (default: the artifact's)."),
    ] = None,
    bits: Annotated[
        float | None, typer.Option(help="Weights at this many bits per matrix weight instead.")
    ] = None,
    prefill_chunk: Annotated[int, typer.Option(help="Tokens per engine step.")] = 2048,
    state_snapshots: StateSnapshots = None,
    rope_scaling: RopeScaling = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
):
    """Solve the VRAM budget: context, concurrency and KV dtype for a model on a GPU."""
    from engine.cache.kv_layout import resolve_kv_dtype
    from engine.errors import NinferError
    from engine.memory import Deployment, ledger, validate
    from engine.plan.gpu import local_gpu, parse_sm
    from engine.plan.model import resolve
    from engine.plan.solver import Device, PlanRefusal, frontier, solve, solve_any_concurrency

    if vram is None and sm is not None:
        raise NinferError("--sm goes with --vram; without --vram the local GPU is read")
    vram_bytes = parse_size(vram, "--vram") if vram is not None else None
    if vram_bytes is not None and vram_bytes < 2**30:  # a bare number is bytes: `--vram 24` is a typo
        raise NinferError(
            f"--vram {vram} is {vram_bytes:,} bytes, under 1 GiB; write the unit, e.g. --vram 24G"
        )
    device = (
        local_gpu()
        if vram_bytes is None
        else Device(f"a {vram} GPU", vram_bytes, parse_sm(sm) if sm else None)
    )
    if concurrency is not None and concurrency < 1:
        raise NinferError(f"--concurrency must be 1 or more (got {concurrency})")
    kv = None if kv_dtype == "auto" else resolve_kv_dtype(kv_dtype)
    if kv == "fp32":
        raise NinferError("fp32 KV is for tests; use bf16, fp16, fp8, int8 or k8v4")
    target = parse_size(context, "--context") if context else None
    if target is not None and target < 1:
        raise NinferError(
            f"--context must be 1 token or more (got {context}); leave it out for the most that fits"
        )
    spec_on = spec != "none"
    vision = vision or bool(mmproj)
    planned = resolve(model, preset_name, recipe, bits, mtp=spec == "mtp", vision=vision, mmproj=mmproj)
    planned = replace(planned, config=planned.config.with_rope_scaling_flag(rope_scaling))
    draft = _draft(draft_model, spec)
    if draft is not None:
        _check_draft_vocabulary(planned, draft)
    weights = (
        planned.weights if draft is None else {**planned.weights, "draft model": sum(draft.weights.values())}
    )
    dep = Deployment(
        planned.config,
        kv or "k8v4",
        target or planned.config.position_limit,
        concurrency=concurrency or 1,
        weights=weights,
        packed_weights=planned.packed_weights,
        prefill_chunk=prefill_chunk,
        spec=spec,
        draft_tokens=draft_tokens if spec_on else 0,
        vision=vision,
        int8_prefill=int8_prefill,
        state_snapshots=state_snapshots,
        draft=draft.config if draft is not None else None,
    )
    validate(dep)
    table = frontier(dep, device)
    try:
        if concurrency is None and target is not None:  # preferring context, then concurrency
            chosen = solve_any_concurrency(dep, device, target, kv)
        else:
            chosen = solve(dep, device, target, kv)
    except PlanRefusal as refusal:
        if as_json:
            print(json.dumps(_json(planned, device, None, table, refusal), indent=2))
        else:
            _print_refusal(planned, device, table, refusal)
        raise typer.Exit(2) from None
    rows = ledger(chosen, device.total_bytes)
    line = serve_line(
        planned.serve_arg + planned.serve_flags,
        chosen,
        rope_scaling,
        draft.serve_arg if draft is not None else None,
        mmproj,
    )
    if as_json:
        print(json.dumps(_json(planned, device, (chosen, rows, line), table, None), indent=2))
        return
    _print_plan(planned, device, chosen, rows, table, line)


def _draft(draft_model: str | None, spec: str):
    """The planned draft model of --spec draft (None without one)."""
    from engine.errors import NinferError
    from engine.plan.model import resolve

    if draft_model is None:
        return None
    if spec != "draft":
        raise NinferError(f"a draft model drafts with --spec draft (got --spec {spec}); add --spec draft")
    draft = resolve(draft_model, None, None, None, mtp=False, vision=False)
    if draft.config.num_linear_attention_layers:
        raise NinferError(
            f"the draft model {draft.label} is a hybrid (recurrent-state layers); a draft model is a plain "
            "decoder (qwen3-0.6b, qwen3-1.7b); for Qwen3.5 use --spec mtp"
        )
    return draft


def _check_draft_vocabulary(planned, draft) -> None:
    """Where the model and its draft are files (not presets), the vocabulary check serve makes."""
    from engine.models.loader import open_source
    from engine.spec.draft_model import check_vocabulary

    paths = [Path(p.serve_arg).expanduser() for p in (planned, draft)]
    if all(p.exists() for p in paths):
        target, source = open_source(paths[0]), open_source(paths[1])
        check_vocabulary(paths[1], source.tokenizer, target.tokenizer, source.config, target.config)


def serve_line(
    model_arg: str,
    dep,
    rope_scaling: str | None = None,
    draft_arg: str | None = None,
    mmproj: str | None = None,
) -> str:
    spec = f" --spec {dep.spec} --draft-tokens {dep.draft_tokens}" if dep.spec != "none" else ""
    if draft_arg is not None:
        spec += f" --draft-model {shlex.quote(draft_arg)}"
    rope = f" --rope-scaling {shlex.quote(rope_scaling)}" if rope_scaling is not None else ""
    int8 = " --int8-prefill" if dep.int8_prefill else ""
    vision = f" --mmproj {shlex.quote(mmproj)}" if mmproj else " --vision" if dep.vision else ""
    snapshots = f" --state-snapshots {dep.state_snapshots}" if dep.state_snapshots is not None else ""
    return (
        f"ninfer serve {model_arg} --device cuda --dtype bfloat16 --max-context {dep.context} "
        f"--kv-capacity {dep.pool_tokens} --max-concurrency {dep.concurrency} --kv-dtype {dep.kv_dtype} "
        f"--prefill-chunk {dep.prefill_chunk}{spec}{int8}{vision}{rope}{snapshots}{_host_tier(dep)}"
    )


def _host_cache_flag(dep) -> str:
    """`--host-cache SIZE` where the pool is short of every running request's full context, else ""."""
    from engine.memory import host_cache_size

    size = host_cache_size(dep)
    return f"--host-cache {size / GIB:g}G" if size else ""


def _host_tier(dep) -> str:
    """The serve line's host tier: --host-cache, and the host snapshots kept as many as without it."""
    from engine.memory import host_state_snapshots

    flag = _host_cache_flag(dep)
    if not flag:
        return ""
    snapshots, _ = host_state_snapshots(dep)
    return f" {flag}" + (f" --host-state-snapshots {snapshots}" if snapshots else "")


def _header(planned, device) -> str:
    sm = f", SM{device.sm[0]}{device.sm[1]}" if device.sm else ", compute capability not given"
    return f"{planned.label} ({planned.recipe}) on {device.name}: {device.total_bytes / GIB:.2f} GiB{sm}"


def _print_plan(planned, device, chosen, rows, table, line) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(_header(planned, device))
    t = Table(
        title=f"ledger: {chosen.context:,} tokens of context, {chosen.concurrency} running, {chosen.kv_dtype} KV"
    )
    t.add_column("component")
    t.add_column("GiB", justify="right")
    t.add_column("how")
    for r in rows.rows:
        t.add_row(r.component, f"{r.bytes / GIB:.3f}", r.detail)
    t.add_row("total", f"{rows.total / GIB:.3f}", "", style="bold")
    t.add_row(
        "left", f"{(device.total_bytes - rows.total) / GIB:.3f}", f"of {device.total_bytes / GIB:.2f} GiB"
    )
    console.print(t)
    from engine.memory import host_state_snapshots

    snapshots, host_bytes = host_state_snapshots(chosen)
    if snapshots:
        console.print(
            f"host memory beside this ledger: {snapshots} state snapshots the GPU slots evict, "
            f"{host_bytes / GIB:.2f} GiB pinned (--host-state-snapshots N sets how many, 0 none)",
            highlight=False,
        )
    from engine.memory import host_cache_shortfall

    tokens, kv_bytes = host_cache_shortfall(chosen)
    if tokens:
        full = chosen.concurrency * chosen.context
        console.print(
            f"the pool holds {chosen.pool_tokens:,} of the {full:,} tokens {chosen.concurrency} requests take "
            f"at full context: the host tier ({_host_cache_flag(chosen)}, pinned) keeps "
            f"the {tokens:,} tokens' pages ({kv_bytes / GIB:.2f} GiB) one request's turn evicts from "
            "another's cached prefix, copied back rather than computed again",
            highlight=False,
        )
    _print_frontier(console, table)
    if planned.prepare:
        console.print("convert it first:")
        console.print(planned.prepare, soft_wrap=True, highlight=False, markup=False)
    console.print("serve it:")
    console.print(line, soft_wrap=True, highlight=False, markup=False)


def _print_frontier(console, table) -> None:
    from rich.table import Table

    f = Table(title="frontier: the longest context per KV dtype and concurrency")
    f.add_column("KV dtype")
    concurrencies = next(iter(table.values())).keys()
    for c in concurrencies:
        f.add_column(f"C{c}", justify="right")
    reasons = []
    for kv, row in table.items():
        cells = []
        for value in row.values():
            if isinstance(value, str):
                cells.append("excluded")
                if value not in reasons:
                    reasons.append(value)
            else:
                cells.append(f"{value:,}" if value else "does not fit")
        f.add_row(kv, *cells)
    console.print(f)
    for reason in reasons:
        console.print(f"excluded: {reason}")


def _print_refusal(planned, device, table, refusal) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    console.print(_header(planned, device), highlight=False)
    _print_frontier(console, table)
    console.print(f"does not fit: {refusal}", highlight=False, markup=False)
    if refusal.suggestions:
        console.print("ways out:")
    for s in refusal.suggestions:
        console.print(f"  - {s.text}", highlight=False, markup=False)


def _json(planned, device, result, table, refusal) -> dict:
    out = {
        "model": planned.label,
        "weights_recipe": planned.recipe,
        "device": {"name": device.name, "total_bytes": device.total_bytes, "sm": device.sm},
        "frontier": {kv: {str(c): v for c, v in row.items()} for kv, row in table.items()},
    }
    if result:
        chosen, rows, line = result
        out["plan"] = {
            "context": chosen.context,
            "concurrency": chosen.concurrency,
            "kv_dtype": chosen.kv_dtype,
            "kv_capacity": chosen.pool_tokens,
            "ledger": [{"component": r.component, "bytes": r.bytes, "detail": r.detail} for r in rows.rows],
            "total_bytes": rows.total,
            "serve": line,
        }
        from engine.memory import host_state_snapshots

        snapshots, host_bytes = host_state_snapshots(chosen)
        out["plan"]["host_state_snapshots"] = {"count": snapshots, "bytes": host_bytes}
        from engine.memory import host_cache_shortfall, host_cache_size

        tokens, kv_bytes = host_cache_shortfall(chosen)
        out["plan"]["host_cache"] = {
            "bytes": host_cache_size(chosen),
            "kv_tokens": tokens,
            "kv_bytes": kv_bytes,
        }
        if planned.prepare:
            out["plan"]["prepare"] = planned.prepare
    if refusal:
        out["refusal"] = {
            "message": str(refusal),
            "suggestions": [
                {
                    "text": s.text,
                    "context": s.deployment.context,
                    "concurrency": s.deployment.concurrency,
                    "kv_dtype": s.deployment.kv_dtype,
                    "spec": s.deployment.spec,
                    "vision": s.deployment.vision,
                    "prefill_chunk": s.deployment.prefill_chunk,
                }
                for s in refusal.suggestions
            ],
        }
    return out
