"""The `ninfer` command: wiring only; each subcommand lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from ninfer_cli import bench, chat, convert, fetch, plan, serve

app = typer.Typer(
    name="ninfer",
    help="Single-GPU LLM inference engine for Qwen3-family models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        import torch
        import triton

        from engine.version import ninfer_version

        typer.echo(f"ninfer {ninfer_version()} (torch {torch.__version__}, triton {triton.__version__})")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Single-GPU LLM inference engine for Qwen3-family models."""


app.command("bench")(bench.bench)
app.command("chat")(chat.chat)
app.command("convert")(convert.convert)
app.command("fetch")(fetch.fetch)
app.command("plan")(plan.plan)
app.command("serve")(serve.serve)

if __name__ == "__main__":
    app()
