"""The `ninfer` command: wiring only; each subcommand lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from ninfer_cli import bench, chat, convert, fetch, plan, serve
from ninfer_cli.help_format import CONTEXT_SETTINGS, Group

app = typer.Typer(
    name="ninfer",
    help="Single-GPU LLM inference engine for Qwen3-family models.",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help and errors (help_format.py)
    context_settings=CONTEXT_SETTINGS,
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


def run() -> None:
    """The `ninfer` console script: `serve` also takes a command line copied from vllm serve or
    llama-server (ninfer_cli/foreign_flags.py), each foreign flag said on stderr."""
    import sys

    from engine.errors import NinferError

    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        try:
            sys.argv[2:] = _translated(sys.argv[2:])
        except NinferError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    app()


def _translated(args: list[str]) -> list[str]:
    from ninfer_cli.foreign_flags import translate

    args, notes = translate(args)
    for note in notes:
        typer.echo(f"ninfer serve: {note}", err=True)
    return args


if __name__ == "__main__":
    run()
