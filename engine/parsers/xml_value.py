"""Where a Qwen3.5 XML call's parameter value ends (`<parameter=k>\\nvalue\\n</parameter>`), read the same way
whole (engine/parsers/tool_calls.py) and as it streams (engine/parsers/call_stream.py).

* A `</parameter>` that the next parameter, `</function>` or `</tool_call>` follows (whitespace between)
  ends the value; one that other text follows is the value's own (a file that holds the tag).
* Where the model left `</parameter>` out (long contexts, quantized weights: reported across engines), the
  value ends where the next tag begins on a line of its own: `<parameter=` one of the tool's parameters
  (any name when the tool declares none), or `</function>` with `</tool_call>` after it. Parameters do
  not nest.
"""

from __future__ import annotations

import re
from collections.abc import Collection

END_PARAMETER = "</parameter>"
AFTER_VALUE = ("<parameter=", "</function>", "</tool_call>")  # what may follow a value's </parameter>
_OPEN = re.compile(r"<parameter=([^>\n]+)>")
_END_FUNCTION = re.compile(r"</function>\s*</tool_call>")


def value_end(text: str, start: int, names: Collection[str]) -> tuple[int | None, int, int]:
    """The value that begins at `start`: (the index it ends at, None while that is not known; where the
    call's next tag is read; how far the text is surely the value's, what a stream may send: a newline
    that may be the one before the closing tag is not)."""
    p = text.find("<", start)
    while p >= 0:
        tail = text[p : p + 16]
        line = p > 0 and text[p - 1] == "\n"  # (the newline may be the one after the opening tag)
        held = p - 1 if line and p > start else p
        if tail.startswith(END_PARAMETER):
            rest = text[p + len(END_PARAMETER) :].lstrip()
            if rest.startswith(AFTER_VALUE):
                return p, p + len(END_PARAMETER), p
            if not rest or any(tag.startswith(rest) for tag in AFTER_VALUE):
                return None, p, held
        elif END_PARAMETER.startswith(tail):  # the text ends inside what may be the tag
            return None, p, held
        elif line:  # a tag at a line's start: the next one, where the value's </parameter> was left out
            opened = _OPEN.match(text, p)
            if opened is not None and (not names or opened.group(1).strip() in names):
                return p, p, p
            if opened is None and _may_open(text, p):
                return None, p, held
            if _END_FUNCTION.match(text, p):
                return p, p, p
            rest = text[p + len("</function>") :].lstrip() if tail.startswith("</function>") else None
            if "</function>".startswith(tail) or (rest is not None and "</tool_call>".startswith(rest)):
                return None, p, held
        p = text.find("<", p + 1)
    n = len(text)
    return None, n, n - 1 if n > start and text[n - 1] == "\n" else n


def _may_open(text: str, p: int) -> bool:
    """The text ends inside what may be a `<parameter=name>` tag."""
    tail = text[p:]
    if len(tail) <= len("<parameter="):
        return "<parameter=".startswith(tail)
    return tail.startswith("<parameter=") and ">" not in tail and "\n" not in tail
