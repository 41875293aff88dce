"""The `ninfer` command: wiring only; each subcommand lives in its own module."""

from __future__ import annotations

import typer

from ninfer_cli import bench, chat, convert, fetch, plan, serve

app = typer.Typer(
    name="ninfer",
    help="Single-GPU LLM inference engine for Qwen3-family models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Single-GPU LLM inference engine for Qwen3-family models."""


app.command("bench")(bench.bench)
app.command("chat")(chat.chat)
app.command("convert")(convert.convert)
app.command("fetch")(fetch.fetch)
app.command("plan")(plan.plan)
app.command("serve")(serve.serve)

if __name__ == "__main__":
    app()
