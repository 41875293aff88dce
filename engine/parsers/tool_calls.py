"""Qwen tool calls in generated text, parsed as they stream.

Two forms inside `<tool_call>…</tool_call>`:
* Qwen3 JSON: `{"name": "get_weather", "arguments": {"city": "Paris"}}`
* Qwen3.5 XML: `<function=get_weather><parameter=city>Paris</parameter></function>`; parameter values are
  text, typed here by the tool's JSON schema (engine/parsers/param_types.py; untyped: string), ending as
  engine/parsers/xml_value.py reads them (a value may hold `</parameter>`; one whose `</parameter>` was
  left out ends at the next tag); a call whose `</function>` is left out ends at `</tool_call>`.
A call is emitted once complete (and, with `stream`, also as it is written: engine/parsers/call_stream.py).
The JSON form is scanned as JSON (a string holding `</tool_call>` does not end it), the XML form parameter by
parameter. Text outside calls passes through; a partial `<tool_call>` tag at the end of a delta is held
back, so no tag leaks into the text. A call that never completes or does not parse is given back as text at
the end (streaming, one whose start went out ends instead: engine/parsers/reply.py reads a whole reply that
way too, for the routes that do not stream). Whitespace between calls, or after the last, is no text, nor is the
start of a `<tool_call>` tag that ends the reply after a call (one cut short).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from engine.parsers import bare_calls
from engine.parsers.call_stream import CallStream, arguments_json, string_end
from engine.parsers.param_types import tool_param_types, typed_value
from engine.parsers.xml_value import AFTER_VALUE, value_end

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>")
_BARE_TURNS = ("</function>", "<function=", OPEN)  # where a bare call's verdict may change
# a bare call's end (engine/parsers/bare_calls.py): its </function>, the orphan </tool_call> taken with it
_END_BARE = re.compile(r"\s*</function>(?:\s*</tool_call>)?")
_END_FUNCTION = re.compile(r"\s*(?:</function>\s*)?</tool_call>")  # (some calls leave </function> out)

log = logging.getLogger("ninfer")


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    # a call the reply ended inside (parse_reply(cut_calls=True)): its arguments' JSON as far as it was
    # written (what a stream sent), `arguments` the members of it that are whole; None for a finished call
    partial: str | None = None


# with streaming on (ToolCallParser(stream=True)), a call also comes as it is written: its start (the name),
# pieces of its arguments' JSON (adding up to arguments_json of the finished call's arguments), then the
# ToolCall itself; a started call that never completes (the reply ends, or the text leaves the form and
# does not parse) ends with CallEnd instead, and its text is not given back (it went out as arguments)
@dataclass
class CallStart:
    name: str


@dataclass
class CallArgs:
    text: str


@dataclass
class CallEnd:
    pass


def _schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, tuple[str, ...]]]:
    """{tool: {parameter: the JSON types its schema admits}}."""
    out = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = tool_param_types(fn.get("parameters") or fn.get("input_schema"))
    return out


class ToolCallParser:
    def __init__(self, tools: list[dict[str, Any]] | None, stream: bool = False):
        """stream: calls also come as they are written (CallStart, CallArgs ..., then ToolCall or CallEnd)."""
        self.schemas = _schemas(tools)
        self.buffer = ""
        self.in_call = False
        self.after_call = False  # a call just ended: whitespace before the next call or the end is dropped
        self.stream = stream
        self._call: CallStream | None = None  # the call being streamed
        self._fed = 0  # buffer characters the call's stream has read
        self._unclosed = 0  # the call's body holds no closing tag before this offset
        self.in_bare = False  # the buffer starts where a call without its <tool_call> may (bare_calls.py)
        self._bare_seen = 0  # the buffer's length when that was last looked at
        self._bare_named = False  # ... and whether its first tag's name was read then
        self.prose = bare_calls.ProseState()  # where the text given out so far leaves the next

    def feed(self, delta: str, final: bool = False) -> list[str | ToolCall | CallStart | CallArgs | CallEnd]:
        """Text pieces and complete ToolCalls (and, streaming, the calls' pieces), in order."""
        self.buffer += delta
        events: list[str | ToolCall] = []
        while self.buffer:
            if self.in_bare:
                # (read again only where a block may have ended or begun since: a long bare call is not
                # parsed again for every piece of it)
                fresh = self.buffer[max(0, self._bare_seen - len("</function>")) :]
                named = ">" in self.buffer.partition("\n")[0]  # (its name read: checked once)
                quiet = not any(t in fresh for t in _BARE_TURNS) and named == self._bare_named
                self._bare_seen, self._bare_named = len(self.buffer), named
                if not final and quiet:
                    break
                verdict = self._bare_verdict(final)
                if verdict is None:  # not known yet
                    break
                self.in_bare, self._bare_seen, self._bare_named = False, 0, False
                if verdict is False:  # text after all: its first character out, the rest read on as text
                    self._text(events, self.buffer[0])
                    self.buffer = self.buffer[1:]
                    continue
                calls, used = verdict
                events += calls
                self.buffer, self.after_call, self.prose.line_start = self.buffer[used:], True, True
                continue
            if self.after_call and not self.in_call:
                body = self.buffer.lstrip()
                if body.startswith((OPEN, bare_calls.FUNCTION)):  # (a bare one, from a line's start)
                    self.buffer, self.after_call, self.prose.line_start = body, False, True
                elif not body or OPEN.startswith(body) or bare_calls.FUNCTION.startswith(body):
                    # held until what follows is known; at the end, the start of a call cut short: no text
                    self.buffer = "" if final else self.buffer
                    break
                else:
                    self.after_call = False  # text follows the call: it keeps its whitespace
                continue
            if not self.in_call:
                at = self.buffer.find(OPEN)
                bare = bare_calls.candidate(
                    self.buffer, len(self.buffer) if at < 0 else at, self.prose, self.schemas
                )
                if bare is not None:
                    self._text(events, self.buffer[:bare])
                    self.buffer, self.in_bare = self.buffer[bare:], True
                    continue
                if at < 0:
                    keep = 0 if final else _partial_suffix(self.buffer, OPEN)
                    bare_start = 0 if final else _partial_suffix(self.buffer, bare_calls.FUNCTION)
                    if bare_calls.at_line_start(self.buffer, len(self.buffer) - bare_start, self.prose):
                        keep = max(keep, bare_start)  # (what may begin a bare call's <function= held too)
                    text, self.buffer = (
                        self.buffer[: len(self.buffer) - keep],
                        self.buffer[len(self.buffer) - keep :],
                    )
                    self._text(events, text)
                    break
                self._text(events, self.buffer[:at])
                self.buffer, self.in_call, self._unclosed = self.buffer[at + len(OPEN) :], True, 0
                if self.stream:
                    self._call, self._fed = CallStream(self.schemas), 0
                continue
            # a call completes only with its closing tag: until one shows, the body is not parsed again (and
            # the tag is looked for in the new text only)
            closed = self.buffer.find(CLOSE, self._unclosed) >= 0
            self._unclosed = max(0, len(self.buffer) - len(CLOSE) + 1)
            parsed = self._parse_call(self.buffer) if closed or final else None
            if parsed is None:  # incomplete
                events += self._streamed()
                if final:
                    events.append(CallEnd() if self._started() else OPEN + self.buffer)
                    self.buffer, self.in_call, self._call = "", False, None
                break
            call, used = parsed
            if self._started():
                events += self._streamed() + self._finish(call)
            elif call is None:  # complete but not a call we can read: give it back as text
                self._text(events, OPEN + self.buffer[:used])
            else:
                events.append(call)
            self.buffer, self.in_call, self.after_call, self._call = self.buffer[used:], False, True, None
            self.prose.line_start = True
        return events

    def _text(self, events: list, text: str) -> None:
        if text:
            events.append(text)
            self.prose.note(text)

    def _bare_verdict(self, final: bool) -> tuple[list[ToolCall], int] | bool | None:
        """The buffer from a bare call's possible start: (its calls, the characters they take) where they are
        calls, False where it is text, None while not known (bare_calls.py says which is which)."""
        text, pos, calls = self.buffer, 0, []
        while True:
            rest = text[pos:]
            body = rest.lstrip()
            start = pos + len(rest) - len(body)
            if not body:  # the calls so far end the reply (or more may come)
                return (calls, len(text)) if final and calls else (False if final else None)
            if calls and body.startswith(OPEN):  # a wrapped call follows them
                return calls, start
            if not body.startswith(bare_calls.FUNCTION):
                maybe = bare_calls.FUNCTION.startswith(body) or (
                    bool(calls) and (OPEN.startswith(body) or CLOSE.startswith(body))
                )
                return None if maybe and not final else False
            parsed = self._parse_xml(text[start:], _END_BARE)
            if parsed is None:  # not whole yet
                return False if final else None
            call, used = parsed
            if call is None or call.name not in self.schemas:
                return False
            calls.append(call)
            pos = start + used

    def _started(self) -> bool:
        return self._call is not None and self._call.name is not None

    def _streamed(self) -> list[CallStart | CallArgs]:
        """The call's new pieces: its start once the name is read, then its arguments as far as certain."""
        if self._call is None:
            return []
        name, piece = self._call.feed(self.buffer[self._fed :])
        self._fed = len(self.buffer)
        return ([CallStart(name)] if name is not None else []) + ([CallArgs(piece)] if piece else [])

    def _finish(self, call: ToolCall | None) -> list[ToolCall | CallArgs | CallEnd]:
        """A streamed call's end: the rest of its arguments, then the call (CallEnd if it did not parse)."""
        if call is None:
            return [CallEnd()]
        whole, sent = arguments_json(call.arguments), self._call.sent
        if not whole.startswith(sent):  # (a key given twice: the client already has the first value)
            log.warning("tool call %s: the streamed arguments differ from the parsed ones", call.name)
            return [call]
        return ([CallArgs(whole[len(sent) :])] if len(whole) > len(sent) else []) + [call]

    def _parse_call(self, text: str) -> tuple[ToolCall | None, int] | None:
        stripped = len(text) - len(text.lstrip())
        body = text[stripped:]
        if not body:
            return None
        if body.startswith("{"):
            return self._parse_json(text, stripped)
        if body.startswith("<function=") or "<function=".startswith(body[:10]):
            return self._parse_xml(text)
        end = text.find(CLOSE)
        return None if end < 0 else (None, end + len(CLOSE))

    def _parse_json(self, text: str, start: int) -> tuple[ToolCall | None, int] | None:
        try:
            obj, end = json.JSONDecoder().raw_decode(text, start)
        except json.JSONDecodeError:
            close = _close_after_json(text, start)
            return None if close < 0 else (None, close)
        rest = text[end:]
        tail = len(rest) - len(rest.lstrip())
        if not rest[tail:].startswith(CLOSE):
            if len(rest[tail:]) < len(CLOSE) and CLOSE.startswith(rest[tail:]):
                return None
            close = text.find(CLOSE, end)
            return None if close < 0 else (None, close + len(CLOSE))
        used = end + tail + len(CLOSE)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None, used
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None, used
        return (ToolCall(obj["name"], args) if isinstance(args, dict) else None), used

    def _parse_xml(self, text: str, end_re: re.Pattern = _END_FUNCTION) -> tuple[ToolCall | None, int] | None:
        m = _FUNCTION.match(text)
        if m is None:
            return None if CLOSE not in text else (None, text.find(CLOSE) + len(CLOSE))
        name, pos = m.group(1).strip(), m.end()
        schema = self.schemas.get(name, {})
        args: dict[str, Any] = {}
        while True:
            end = end_re.match(text, pos)
            if end is not None:
                return ToolCall(name, args), end.end()
            p = _PARAMETER.match(text, pos)
            if p is None:
                # neither a parameter nor the end yet: incomplete, unless a close tag shows it is malformed
                rest = text[pos:].lstrip()
                if rest and not any(tag.startswith(rest[: len(tag)]) for tag in AFTER_VALUE):
                    close = text.find(CLOSE, pos)
                    return None if close < 0 else (None, close + len(CLOSE))
                return None
            end, resume, _ = value_end(text, p.end(), schema.keys())
            if end is None:
                return None
            arg = p.group(1).strip()
            args[arg] = typed_value(text[p.end() : end], schema.get(arg, ()))
            pos = resume


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _close_after_json(text: str, start: int) -> int:
    """Malformed JSON: the end of the first </tool_call> outside any JSON string, or -1 if not seen yet."""
    i = start
    while i < len(text):
        if text[i] == '"':
            i = string_end(text, i)
            if i < 0:
                return -1
            continue
        if text.startswith(CLOSE, i):
            return i + len(CLOSE)
        i += 1
    return -1


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[ToolCall]]:
    """(text outside the calls, the calls) of a whole reply."""
    events = ToolCallParser(tools).feed(text, final=True)
    return "".join(e for e in events if isinstance(e, str)), [e for e in events if isinstance(e, ToolCall)]
