"""`ninfer convert SRC OUT --recipe ...`: an HF checkpoint directory or a GGUF file -> a .ninfer container."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ninfer_cli.errors import exits_cleanly


@exits_cleanly
def convert(
    src: Annotated[str, typer.Argument(help="HF checkpoint directory or .gguf file.")],
    out: Annotated[str, typer.Argument(help="The .ninfer file to write.")],
    recipe: Annotated[
        str, typer.Option(help="q4.6 (mixed, ~4.6 bits/weight), w4g128, w6g128, w8g128 or bf16.")
    ] = "q4.6",
    method: Annotated[
        str,
        typer.Option(
            help="gptq: each linear weight quantized against its inputs on calibration text (error "
            "compensation); rtn: round to nearest."
        ),
    ] = "gptq",
    mmproj: Annotated[
        str | None,
        typer.Option(
            "--mmproj",
            help="A GGUF SRC's vision tower (llama.cpp's mmproj file): the artifact carries it (16-bit).",
        ),
    ] = None,
):
    """Quantize a model into one .ninfer file (streamed tensor by tensor)."""
    from engine.quant.convert import METHODS
    from engine.quant.convert import convert as run_convert
    from engine.quant.recipes import RECIPES

    if recipe not in RECIPES:
        from engine.errors import NinferError

        raise NinferError(f"unknown recipe '{recipe}'; use one of {', '.join(RECIPES)}")
    if method not in METHODS:
        from engine.errors import NinferError

        raise NinferError(f"unknown method '{method}'; use one of {', '.join(METHODS)}")
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total or None)
            bar.update(tasks[phase], completed=done)

        rows = run_convert(src, out, recipe, progress, method, mmproj)
    table = Table(title=f"{out} ({recipe}, {method})")
    for col in ("tensor kind", "tensors", "bits", "MiB", "bits/weight"):
        table.add_column(col, justify="left" if col == "tensor kind" else "right")
    total_bytes = 0
    for r in rows:
        total_bytes += r["bytes"]
        table.add_row(
            r["kind"],
            str(r["tensors"]),
            r["bits"],
            f"{r['bytes'] / 2**20:.2f}",
            f"{r['bits_per_weight']:.2f}",
        )
    table.add_row("all", str(sum(r["tensors"] for r in rows)), "", f"{total_bytes / 2**20:.2f}", "")
    Console().print(table)
