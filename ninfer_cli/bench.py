"""`ninfer bench`: pp / tg measured apart on cold prompts of exact length, in process or against any
OpenAI-compatible server; `ninfer bench compare A.json B.json` puts two runs side by side."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from engine.sizes import parse_size
from ninfer_cli.errors import exits_cleanly
from ninfer_cli.int8_option import Int8Prefill
from ninfer_cli.model_options import ChatTemplate, RopeScaling
from ninfer_cli.spec_options import DraftModel, DraftTokens, LmHeadDraft, Spec, spec_options


def _list(text: str, what: str, parse, example: str) -> tuple[int, ...]:
    from engine.errors import NinferError

    try:
        values = tuple(parse(v) for v in text.split(",") if v.strip())
    except NinferError:
        raise
    except ValueError as e:
        raise NinferError(f"{what} '{text}' is not a comma-separated list; write e.g. {example}") from e
    if not values or any(v <= 0 for v in values):
        raise NinferError(f"{what} '{text}' needs positive values, e.g. {example}")
    return values


@exits_cleanly
def bench(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="MODEL (in process; none = the embedded default; dummy:PRESET[:RECIPE] = random weights), "
            "or: compare A.json B.json"
        ),
    ] = None,
    url: Annotated[str | None, typer.Option(help="Benchmark this OpenAI-compatible server instead.")] = None,
    api_key: Annotated[str | None, typer.Option(help="The server's API key.")] = None,
    model: Annotated[
        str | None, typer.Option(help="The served model name (default: the first listed).")
    ] = None,
    ctx: Annotated[str, typer.Option(help="Prompt lengths in tokens, e.g. 1k,4k,32k,128k.")] = "1k,4k",
    concurrency: Annotated[str, typer.Option(help="Requests at once, e.g. 1,2.")] = "1,2",
    scenario: Annotated[str, typer.Option(help="random, coding or agent.")] = "random",
    gen: Annotated[int, typer.Option(help="Tokens generated per request (EOS ignored).")] = 256,
    temperature: Annotated[
        float,
        typer.Option(
            help="0 (the default): greedy. Above: each request sampled at it, seeded by its stream, as an "
            "agent samples (speculative decoding's acceptance depends on it)."
        ),
    ] = 0.0,
    repeat: Annotated[int, typer.Option(help="Runs per context x concurrency.")] = 3,
    turns: Annotated[
        int,
        typer.Option(
            help="With --scenario agent: requests per conversation. After the cold first, each adds the "
            "model's tool call and a tool result (1,024 tokens) and sends the conversation again, as an agent "
            "does; those rows give TTFT and the tokens the prefix cache served (default 1: cold only).",
        ),
    ] = 1,
    subagent_turns: Annotated[
        int,
        typer.Option(
            help="With --turns: then K turns of a subagent's conversation while the agent's waits, then the "
            "agent's next turn; its row shows whether the server kept the agent's prefix through them.",
        ),
    ] = 0,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write every measurement here.")] = None,
    label: Annotated[str | None, typer.Option(help="Name of this run in tables and compare.")] = None,
    device: Annotated[str, typer.Option(help="In process: cpu or cuda.")] = "cpu",
    dtype: Annotated[
        str,
        typer.Option(
            help="In process: auto (bfloat16 on a GPU, float32 on the CPU), float32, bfloat16, float16."
        ),
    ] = "auto",
    kv_dtype: Annotated[str, typer.Option(help="In process: auto, bf16, fp16, fp8, int8, k8v4.")] = "auto",
    weight_quant: Annotated[
        str, typer.Option(help="In process: auto, none, int8, int4 (as serve's --weight-quant).")
    ] = "auto",
    spec: Spec = "none",
    draft_tokens: DraftTokens = 3,
    lm_head_draft: LmHeadDraft = False,
    draft_model: DraftModel = None,
    int8_prefill: Int8Prefill = False,
    rope_scaling: RopeScaling = None,
    chat_template: ChatTemplate = None,
    model_config: Annotated[
        str | None, typer.Option(help="HTTP: a preset or model path, for roofline % (e.g. qwen3.5-27b).")
    ] = None,
    peak_bw: Annotated[
        float | None, typer.Option(help="Peak memory bandwidth in GB/s (default: GPU table).")
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option(help="Peak 16-bit tensor TFLOP/s (default: table).")
    ] = None,
):
    """Benchmark prefill and decode on cold prompts of exact length (C1 and C2 apart)."""
    from engine.errors import NinferError

    args = args or []
    if args and args[0] == "compare":
        if len(args) != 3:
            raise NinferError("compare needs two result files: ninfer bench compare A.json B.json")
        return _compare(Path(args[1]), Path(args[2]))
    if len(args) > 1:
        raise NinferError(
            f"one MODEL at most (got {len(args)}); to compare runs: ninfer bench compare A.json B.json"
        )
    if url and args:
        raise NinferError("pass either MODEL (in process) or --url (a server), not both")
    from engine.bench.workloads import SCENARIOS

    if scenario not in SCENARIOS:
        raise NinferError(f"unknown --scenario '{scenario}'; use one of {', '.join(SCENARIOS)}")
    if gen < 2 or repeat < 1:
        raise NinferError("--gen must be at least 2 (tg needs two tokens) and --repeat at least 1")
    if turns < 1:
        raise NinferError(f"--turns is the requests of each conversation, 1 or more (got {turns})")
    if turns > 1 and scenario != "agent":
        raise NinferError(
            f"--turns {turns} goes on with an agent's conversation (tool calls and results); add --scenario "
            "agent, or leave --turns out"
        )
    if subagent_turns < 0 or (subagent_turns and turns < 2):
        raise NinferError(
            f"--subagent-turns {subagent_turns} runs a subagent's turns between an agent's; give it with "
            "--turns 2 or more (and --scenario agent), or leave it out"
            if subagent_turns > 0
            else f"--subagent-turns is a count of turns, 0 or more (got {subagent_turns})"
        )
    if not 0.0 <= temperature <= 2.0:
        raise NinferError(f"--temperature {temperature:g} is out of range; use 0 (greedy) up to 2")
    if json_file is not None:  # said now, not after the whole run
        if json_file.is_dir():
            raise NinferError(
                f"--json {json_file} is a directory; name a file in it, e.g. {json_file / 'bench.json'}"
            )
        folder = json_file.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            why = "does not exist" if not folder.is_dir() else "is not writable"
            raise NinferError(f"--json {json_file}: the folder {folder} {why}; create it or write elsewhere")
    contexts = _list(ctx, "--ctx", lambda v: parse_size(v, "--ctx"), "4k,32k")
    concurrencies = _list(concurrency, "--concurrency", int, "1,2")
    _run(
        _Options(
            args[0] if args else None,
            url,
            api_key,
            model,
            contexts,
            concurrencies,
            scenario,
            turns,
            subagent_turns,
            gen,
            temperature,
            repeat,
            json_file,
            label,
            device,
            dtype,
            kv_dtype,
            weight_quant,
            spec,
            draft_tokens,
            lm_head_draft,
            draft_model,
            int8_prefill,
            rope_scaling,
            chat_template,
            model_config,
            peak_bw,
            peak_tflops,
        )
    )


@dataclass(frozen=True)
class _Options:
    """The command's flags, parsed."""

    model_path: str | None
    url: str | None
    api_key: str | None
    served: str | None
    contexts: tuple[int, ...]
    concurrencies: tuple[int, ...]
    scenario: str
    turns: int
    subagent_turns: int
    gen: int
    temperature: float
    repeat: int
    json_file: Path | None
    label: str | None
    device: str
    dtype: str
    kv_dtype: str
    weight_quant: str
    spec: str
    draft_tokens: int
    lm_head_draft: bool
    draft_model: str | None
    int8_prefill: bool
    rope_scaling: str | None
    chat_template: str | None
    model_config: str | None
    peak_bw: float | None
    peak_tflops: float | None


def _run(o: _Options) -> None:
    from rich.console import Console
    from rich.progress import Progress

    from engine.bench.drivers import InProcess, OverHttp
    from engine.bench.report import run_table
    from engine.bench.roofline import ModelCost, cost_of_llm, matmul_weights, peaks_for
    from engine.bench.suite import BenchConfig, run_suite, summarise
    from engine.bench.telemetry import Telemetry
    from engine.bench.workloads import TURN_TOKENS
    from engine.config import resolve_dtype
    from engine.errors import NinferError

    cfg = BenchConfig(
        o.contexts, o.concurrencies, o.scenario, o.gen, o.repeat, o.temperature, o.turns, o.subagent_turns
    )
    flags = {
        "device": o.device,
        "dtype": resolve_dtype(o.dtype, o.device),  # as the engine runs it (auto: by the device)
        "kv_dtype": o.kv_dtype,
        "weight_quant": o.weight_quant,
        "spec": o.spec,
        "draft_tokens": o.draft_tokens if o.spec != "none" else 0,
        "lm_head_draft": o.lm_head_draft,
        "draft_model": o.draft_model,
        "int8_prefill": o.int8_prefill,
        "rope_scaling": o.rope_scaling,
        "chat_template": o.chat_template,
    }
    if o.url:
        driver = OverHttp(o.url, o.api_key, o.served)
        name = o.label or f"{driver.model} @ {o.url}"
        cost = None
        if o.model_config:
            from engine.plan.model import resolve

            planned = resolve(o.model_config, None, None, None, False, False)
            held = planned.weights
            experts = held.get("experts", 0)
            weights = sum(held.values()) - held.get("embedding", 0) - experts
            kv = "bf16" if o.kv_dtype == "auto" else o.kv_dtype  # the server's KV class, as far as we know it
            cost = ModelCost(planned.config, weights, matmul_weights(planned.config), kv, experts)
        flags = {"url": o.url, "model": driver.model, "model_config": o.model_config}
    else:
        from engine import LLM
        from engine.models.loader import open_source
        from engine.rope_scaling import positions_phrase, stretch_hint

        # each later turn's tool call and result: the agent's (one more after subagent turns), the subagent's
        agent_later = o.turns - 1 + (1 if o.subagent_turns else 0)
        later = max(agent_later, o.subagent_turns - 1)
        grown = later * TURN_TOKENS
        longest = max(o.contexts) + grown + o.gen
        config = open_source(o.model_path).config.with_rope_scaling_flag(o.rope_scaling)
        limit = config.position_limit
        if longest > limit:
            scaling, positions = config.rope_scaling, config.max_position_embeddings
            turns = f" + {later} turns x {TURN_TOKENS}" if grown else ""
            raise NinferError(
                f"--ctx {max(o.contexts)}{turns} + --gen {o.gen} = {longest} tokens is beyond the model's "
                f"{positions_phrase(scaling, positions)}; use --ctx up to {limit - grown - o.gen}"
                f"{stretch_hint(longest, scaling, positions)}"
            )
        # each stream's conversations whole: the agent's, and its subagent's while it waits
        conversations = max(o.contexts) * 2 + (agent_later + o.subagent_turns - 1) * TURN_TOKENS + 2 * o.gen
        pool = (longest if not o.subagent_turns else conversations) * max(o.concurrencies)
        llm = LLM(
            o.model_path,
            device=o.device,
            dtype=o.dtype,
            kv_dtype=o.kv_dtype,
            weight_quant=o.weight_quant,
            max_context=longest,
            max_concurrency=max(o.concurrencies),
            kv_capacity=pool,
            prefill_chunk=max(2048, max(o.concurrencies)),
            **spec_options(o.spec, o.draft_tokens, o.lm_head_draft, o.draft_model),
            int8_prefill=o.int8_prefill,
            rope_scaling=o.rope_scaling,
            chat_template=o.chat_template,
        )
        if llm.tokenizer is None:
            raise NinferError("this model has no tokenizer; benchmark prompts are built with it")
        if llm.text_refusal:
            raise NinferError(
                "this model makes no text (an embedding model or a classifier reranker); bench measures "
                "prefill and decode of a model that generates"
            )
        driver = InProcess(llm)
        from engine.formats.dummy import is_dummy
        from engine.models.loader import default_model_path

        shown = o.model_path if is_dummy(o.model_path) else Path(o.model_path or default_model_path()).name
        name = o.label or f"ninfer {shown} ({o.device})"
        cost = cost_of_llm(llm)
    telemetry = Telemetry()
    peaks = peaks_for(
        telemetry.environment.get("gpu"),
        o.peak_bw * 1e9 if o.peak_bw else None,
        o.peak_tflops * 1e12 if o.peak_tflops else None,
    )
    total = len(o.contexts) * len(o.concurrencies) * o.repeat
    started = time.time()
    with Progress(console=Console(stderr=True), transient=True) as progress, telemetry:
        task = progress.add_task("warm-up", total=total)
        calls = [0]

        def step(text: str) -> None:  # called before each run: the previous one is done
            progress.update(task, description=text, completed=calls[0])
            calls[0] += 1

        records = run_suite(driver, cfg, telemetry, step)
        progress.update(task, completed=total)
    rows = summarise(records, cost, peaks)
    result = {
        "label": name,
        "mode": "http" if o.url else "in-process",
        "date": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "environment": {
            **telemetry.environment,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "flags": flags,
            "command": sys.argv,
        },
        "peaks": {"bandwidth_bytes_s": peaks.bandwidth, "flops": peaks.flops, "source": peaks.source},
        "config": {
            "contexts": o.contexts,
            "concurrencies": o.concurrencies,
            "scenario": o.scenario,
            "gen": o.gen,
            "repeat": o.repeat,
            "temperature": o.temperature,
            "turns": o.turns,
            "subagent_turns": o.subagent_turns,
        },
        "rows": rows,
        "records": records,
    }
    console = Console()
    if not console.is_terminal:  # a file or a pipe: wide enough for every column
        console = Console(width=170)
    console.print(run_table(result))
    if o.json_file:
        o.json_file.write_text(json.dumps(result, indent=1))
        Console(stderr=True).print(f"wrote {o.json_file}")


def _compare(a_path: Path, b_path: Path) -> None:
    from rich.console import Console

    from engine.bench.report import compare_tables
    from engine.errors import NinferError

    runs = []
    for path in (a_path, b_path):
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise NinferError(
                f"{path} does not exist; pass two files written by ninfer bench --json"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise NinferError(
                f"{path} is not JSON ({e}); pass files written by ninfer bench --json"
            ) from None
        if not isinstance(data, dict) or "rows" not in data or "label" not in data:
            raise NinferError(f"{path} is not a ninfer bench result (no rows / label)")
        runs.append(data)
    table, lines = compare_tables(*runs)
    console = Console()
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)
