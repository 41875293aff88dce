"""The chat REPL's input: a message is one line; or lines joined while each ends with a backslash (as
llama.cpp's CLI has it); or the lines between one that opens with three double quotes and one that closes
with them (as ollama has it), kept as typed — code pasted whole is one message, docstrings and all."""

from __future__ import annotations

import atexit
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

FENCE = '"""'
HISTORY_LINES = 1000
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
    """The block after an opening fence. Opened bare (the quotes alone), it ends at a line of the three
    quotes alone, not indented, so pasted code with docstrings stays whole; opened with text, at the first
    line that ends with them (as ollama has it)."""
    if len(first.rstrip()) >= len(FENCE) and first.rstrip().endswith(FENCE):  # """all on one line"""
        return first.rstrip()[: -len(FENCE)]
    inline = bool(first.strip())
    lines = [first] if inline else []
    while True:
        try:
            line = read_line(MORE).rstrip("\r\n")
        except EOFError:
            break
        if line.rstrip() == FENCE:
            break
        if inline and line.rstrip().endswith(FENCE):
            lines.append(line.rstrip()[: -len(FENCE)])
            break
        lines.append(line)
    return "\n".join(lines)


def terminal_line_reader(history: Path) -> Callable[[str], str]:
    """read_line at a terminal: `input` with line editing (arrows, Ctrl-R) and the lines of earlier sessions
    (the last HISTORY_LINES, kept in `history`) where Python has its readline module; plain `input`
    elsewhere."""
    try:
        import readline
    except ImportError:  # Windows' Python has none
        return input
    readline.set_history_length(HISTORY_LINES)
    with contextlib.suppress(OSError):  # none yet, or unreadable: start afresh
        readline.read_history_file(history)

    def save() -> None:
        with contextlib.suppress(OSError):  # a read-only home loses the history, not the session
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)

    atexit.register(save)
    return input


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
