"""Qwen3.5 XML calls written without their `<tool_call>` wrapper: Qwen3.5 / 3.6 / Qwen3-Coder now and then write
`<function=name>...</function>` bare (quantized weights, long agent sessions), often with an orphan
`</tool_call>` after it. Such a reply's call was text, and the agent's turn ended with nothing to run.

A bare block is taken for a call only where a model's own call would be and prose about calls would not:
`<function=` at the start of a line, outside a markdown code fence, naming a tool the request declares, and
the block (or a run of them, whitespace and orphan `</tool_call>`s between) ending the reply or followed by a
wrapped call. From such a start the text is held until that is known; anything else after a block, a
malformed block, or an undeclared name, and the held text is text after all.
"""

from __future__ import annotations

import re

FUNCTION = "<function="
FENCE = "```"
_NAME = re.compile(r"<function=([^>\n]*)(>?)")


class ProseState:
    """What the text given out so far says about where the next text stands: at a line's start, inside a
    code fence."""

    def __init__(self) -> None:
        self.line_start = True
        self.fences = 0
        self._tail = ""  # the last two characters (a fence split between pieces)

    def note(self, text: str) -> None:
        if not text:
            return
        joined = self._tail + text
        self.fences += joined.count(FENCE)
        self._tail = joined[-2:] if not joined.endswith(FENCE) else ""
        self.line_start = text.endswith("\n")

    def in_fence(self, before: str) -> bool:
        """Whether text after this state and `before` stands inside a code fence."""
        return (self.fences + (self._tail + before).count(FENCE)) % 2 == 1


def candidate(buffer: str, limit: int, prose: ProseState, names) -> int | None:
    """Where in `buffer[:limit]` a bare call may start (its name read and declared, or not read yet); None."""
    start = 0
    while True:
        k = buffer.find(FUNCTION, start, limit)
        if k < 0:
            return None
        if at_line_start(buffer, k, prose) and not prose.in_fence(buffer[:k]):
            m = _NAME.match(buffer, k)
            if not m.group(2) or m.group(1).strip() in names:
                return k
        start = k + 1


def at_line_start(buffer: str, k: int, prose: ProseState) -> bool:
    """Whether `buffer[k:]` begins a line (the buffer's start: where the text given out left off)."""
    return buffer[k - 1] == "\n" if k else prose.line_start
