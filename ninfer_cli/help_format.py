"""How `ninfer ... --help` (or -h) reads: plain help as vllm's and llama-server's print it (an option's names
on one line, its help beside it or, when the names are long, below them), each value's placeholder a word
(TEXT, INT, FLOAT, PATH; a name where the option gives one) and a switch none."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import get_args, get_origin

from typer.core import TyperGroup

# (click's default: 80 columns on any terminal, and --help alone: vllm and llama-server take -h too)
CONTEXT_SETTINGS = {"max_content_width": 120, "help_option_names": ["-h", "--help"]}
WORDS = {str: "TEXT", int: "INT", float: "FLOAT", Path: "PATH"}


class Group(TyperGroup):
    """The `ninfer` group: each subcommand's options named as `placeholders` names them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            placeholders(command)


def placeholders(command) -> None:
    """Give every value option of `command` that names no placeholder a word for its value's type, and the
    MODEL-like arguments their name in capitals (without typer's `<str>` after it, and in the usage line
    without its braces around a required one: `convert [OPTIONS] SRC OUT`)."""
    for param in command.params:
        if param.param_type_name == "argument":
            param.metavar = param.metavar or param.name.upper()
            param.display_type_rich = _no_type
            param._usage_display_name = functools.partial(_usage_name, param)
        elif not (param.metavar or getattr(param, "is_flag", False) or getattr(param, "count", False)):
            param.metavar = value_word(param)


def _usage_name(param) -> str:
    """An argument in the usage line: NAME when required, [NAME] when not, `...` after one taking several."""
    name = param.metavar
    return (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else "")


def _no_type(ctx) -> None:
    """An argument's type in its help line: none (its name says what it takes)."""
    return None


def value_word(param) -> str:
    """TEXT / INT / FLOAT / PATH for the value's type (a list's items'), read from the annotation typer keeps
    or the click type it made."""
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    if annotation in WORDS:
        return WORDS[annotation]
    kind = getattr(getattr(param, "type", None), "name", "") or ""
    return {"integer": "INT", "float": "FLOAT", "path": "PATH"}.get(kind.lower(), "TEXT")
