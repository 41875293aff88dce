"""A model reply taken apart as it streams: reasoning, answer text and tool calls, in order."""

from __future__ import annotations

from typing import Any

from engine.parsers.call_stream import partial_arguments
from engine.parsers.reasoning import ReasoningSplitter
from engine.parsers.tool_calls import OPEN as CALL_OPEN
from engine.parsers.tool_calls import CallArgs, CallEnd, CallStart, ToolCall, ToolCallParser


class ReplyParser:
    """feed(delta) -> [("reasoning", str) | ("text", str) | ("tool_call", ToolCall)], never a partial tag.
    With `stream_calls`, a call also comes as it is written: ("tool_call_start", name), then
    ("tool_call_args", JSON piece) ..., then ("tool_call", ToolCall) or, for one that never completes,
    ("tool_call_end", None)."""

    def __init__(
        self,
        starts_in_reasoning: bool,
        tools: list[dict[str, Any]] | None,
        max_calls: int | None = None,
        stream_calls: bool = False,
    ):
        """max_calls: the calls kept (1 when the client turned parallel calls off); later ones are dropped."""
        self.reasoning = ReasoningSplitter(starts_in_reasoning)
        self.tool_specs = tools
        self.tools = ToolCallParser(tools, stream=stream_calls) if tools else None
        self.calls_left = max_calls
        self._dropping = False  # the streamed call under way is past max_calls
        self._thought: list[str] = []  # the reasoning so far, while a call in it may still be made

    def feed(self, delta: str, final: bool = False) -> list[tuple[str, Any]]:
        reasoning, content = self.reasoning.feed(delta, final)
        pieces: list[tuple[str, Any]] = [("reasoning", reasoning)] if reasoning else []
        if self.tools and reasoning:
            self._thought.append(reasoning)
        if final and self.tools and self.reasoning.in_reasoning:
            pieces += self._calls_in_reasoning()
        for piece in self.tools.feed(content, final) if self.tools else [content]:
            if isinstance(piece, CallStart):
                self._dropping = self.calls_left == 0
                if not self._dropping:
                    pieces.append(("tool_call_start", piece.name))
            elif isinstance(piece, CallArgs):
                if not self._dropping:
                    pieces.append(("tool_call_args", piece.text))
            elif isinstance(piece, CallEnd):
                if not self._dropping:
                    pieces.append(("tool_call_end", None))
                self._dropping = False
            elif isinstance(piece, ToolCall):
                dropping, self._dropping = self._dropping, False
                if self.calls_left is not None:
                    if self.calls_left == 0 or dropping:
                        continue
                    self.calls_left -= 1
                pieces.append(("tool_call", piece))
            elif piece:
                pieces.append(("text", piece))
        return pieces

    def _calls_in_reasoning(self) -> list[tuple[str, Any]]:
        """The calls of a reply that ended inside its reasoning with calls written there: Qwen3.5 / 3.6 now
        and then call a tool before closing `</think>` and then end the turn, which left an agent with a
        thought and no call (its turn over, nothing to run). Only whole calls, and only where the reasoning
        never closed: a call merely named in a reasoning that then closes stays reasoning."""
        thought = "".join(self._thought)
        at = thought.find(CALL_OPEN)
        if at < 0:
            return []
        pieces: list[tuple[str, Any]] = []
        for piece in ToolCallParser(self.tool_specs).feed(thought[at:], final=True):
            if not isinstance(piece, ToolCall) or self.calls_left == 0:
                continue
            if self.calls_left is not None:
                self.calls_left -= 1
            pieces.append(("tool_call", piece))
        return pieces


def reply_parts(
    text: str,
    starts_in_reasoning: bool,
    tools: list[dict[str, Any]] | None,
    max_calls: int | None = None,
    cut_calls: bool = False,
) -> tuple[str, list[str | ToolCall]]:
    """(reasoning, the answer as written: its text pieces and tool calls in order) of a whole reply.
    `cut_calls`: a call the reply ended inside (or that left the form) once its name was written is a call
    with `partial` arguments, as a stream sends it (stream_calls), not text given back."""
    pieces = ReplyParser(starts_in_reasoning, tools, max_calls, stream_calls=cut_calls).feed(text, final=True)
    reasoning = "".join(v for k, v in pieces if k == "reasoning")
    parts: list[str | ToolCall] = []
    name, written = None, ""  # the call being written, and its arguments so far
    for kind, value in pieces:
        if kind == "text" and parts and isinstance(parts[-1], str):
            parts[-1] += value
        elif kind == "text":
            parts.append(value)
        elif kind == "tool_call_start":
            name, written = value, ""
        elif kind == "tool_call_args":
            written += value
        elif kind == "tool_call":
            parts.append(value)
        elif kind == "tool_call_end":
            parts.append(ToolCall(name, partial_arguments(written), partial=written))
    return reasoning, parts


def parse_reply(
    text: str,
    starts_in_reasoning: bool,
    tools: list[dict[str, Any]] | None,
    max_calls: int | None = None,
    cut_calls: bool = False,
) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, answer text, tool calls) of a whole reply (`cut_calls`: as reply_parts)."""
    reasoning, parts = reply_parts(text, starts_in_reasoning, tools, max_calls, cut_calls)
    text_parts = [p for p in parts if isinstance(p, str)]
    return reasoning, "".join(text_parts), [p for p in parts if isinstance(p, ToolCall)]
