"""`ninfer ... --help`: plain help, every option listed, each value's placeholder a word and a switch none."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from ninfer_cli.main import app

COMMANDS = ("bench", "chat", "convert", "fetch", "plan", "serve")


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_each_option_is_listed_with_a_word_for_its_value(command):
    out = _help(command)
    assert "╭" not in out and out.startswith(f"Usage: ninfer {command} [OPTIONS]")
    options = out[out.index("\nOptions:\n") :]
    assert not re.search(r"<(str|int|float|bool|path|list)", out), out  # arguments' lines too
    params = typer.main.get_command(app).commands[command].params
    for param in params:
        if param.param_type_name != "option" or param.hidden:
            continue
        first = next(o for o in param.opts if o.startswith("--"))
        shown = re.search(rf"^  (?:-\w+, )?{re.escape(first)}\b(.*)$", options, re.MULTILINE)
        assert shown is not None, f"{first} is not in {command} --help"
        if getattr(param, "is_flag", False):  # a switch takes no value
            assert not re.match(r"[ ,/a-z-]*[A-Z]", shown.group(1).split("  ")[0]), shown.group(0)
        else:
            names = shown.group(0).strip().split("  ")[0]
            assert re.search(r" [A-Z][A-Z0-9_\[\]=.|-]*$", names), shown.group(0)


def test_the_top_level_help_names_every_command_whole():
    out = _help()
    for command in COMMANDS:
        line = next(line for line in out.splitlines() if line.startswith(f"  {command} "))
        assert "..." not in line or command == "serve"  # (serve's sentence is the one longer than a line)


def test_serve_reads_as_its_switches_and_values_are():
    out = _help("serve")
    assert "  --port INT " in out and "  --host TEXT " in out and "--sleep-idle-seconds FLOAT" in out
    assert "  --cuda-graphs / --no-cuda-graphs\n" in out and re.search(r"^  --vision {4,}Load", out, re.M)
    assert "  --model-id, --served-model-name, --alias TEXT\n" in out
    assert "Usage: ninfer serve [OPTIONS] [MODEL]" in out


def test_required_arguments_read_as_their_names():
    assert _help("convert").startswith("Usage: ninfer convert [OPTIONS] SRC OUT\n")
    assert _help("fetch").startswith("Usage: ninfer fetch [OPTIONS] REPO_ID\n")
    assert "\n  SRC  HF checkpoint directory" in _help("convert")


@pytest.mark.parametrize("args", [[], ["serve"], ["chat"]])
def test_h_is_help_as_vllm_and_llama_server_take_it(args):
    short = CliRunner().invoke(app, [*args, "-h"], terminal_width=100)
    assert short.exit_code == 0 and short.output == _help(*args)
