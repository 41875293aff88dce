"""The chat REPL's input: a message is one line; or lines joined while each ends with a backslash (as
llama.cpp's CLI has it); or the lines between one that opens with three double quotes and one that closes
with them (as ollama has it), kept as typed — code pasted whole is one message."""

from __future__ import annotations

import sys
from collections.abc import Callable

FENCE = '"""'
MORE = "... "  # the prompt of a continued message's lines


def read_message(read_line: Callable[[str], str]) -> str | None:
    """The next message (read_line(prompt) returns a line, or raises EOFError at the end of input); None
    at the end of input. A message the end of input cuts short is still returned, whole as far as it got."""
    try:
        line = read_line("> ").rstrip("\r\n")
    except EOFError:
        return None
    if line.lstrip().startswith(FENCE):
        return _fenced(line.lstrip()[len(FENCE) :], read_line)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        try:
            line = read_line(MORE).rstrip("\r\n")
        except EOFError:
            line = ""
            break
    lines.append(line)
    return "\n".join(lines)


def _fenced(first: str, read_line: Callable[[str], str]) -> str:
    if len(first.rstrip()) >= len(FENCE) and first.rstrip().endswith(FENCE):  # """all on one line"""
        return first.rstrip()[: -len(FENCE)]
    lines = [first] if first.strip() else []
    while True:
        try:
            line = read_line(MORE).rstrip("\r\n")
        except EOFError:
            break
        if line.rstrip().endswith(FENCE):
            last = line.rstrip()[: -len(FENCE)]
            if last.strip():
                lines.append(last)
            break
        lines.append(line)
    return "\n".join(lines)


def piped_line_reader(out) -> Callable[[str], str]:
    """read_line for input that is not a terminal: the prompt is written, then a line of stdin read."""

    def read_line(prompt: str) -> str:
        out.write(prompt)
        out.flush()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line

    return read_line
