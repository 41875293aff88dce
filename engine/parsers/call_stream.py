"""A tool call's arguments streamed while the model writes them: the call's name as soon as it is known,
then its arguments as JSON text, piece by piece, in `json.dumps(arguments, ensure_ascii=False)`'s form, so
the pieces put together are the very string the finished call's arguments serialize to
(`arguments_json`). Clients see a long call (a file the model writes) arrive as it is generated, as
OpenAI's, Anthropic's and the Responses API's streams give it.

Both of Qwen's forms (engine/parsers/tool_calls.py), fed the call's body (the text after `<tool_call>`)
as it grows; each `feed` reads only the new text:
* JSON, `{"name": "f", "arguments": {...}}`: once the name and the start of the arguments object are read,
  the object is re-serialized as it streams: strings a character at a time (escapes decoded, re-escaped as
  json.dumps does), numbers and literals once whole, json.dumps's separators. Another key order, or
  arguments given as a string, streams nothing: the call comes whole at its end.
* XML, `<function=f><parameter=k>v</parameter>...</function>`: a string parameter's value streams as it
  comes (one newline after the opening tag and one before the closing tag dropped, as the parser drops
  them); a parameter the tool's schema types otherwise (integer, number, boolean, object, array, null;
  engine/parsers/param_types.py) comes whole; a value ends as engine/parsers/xml_value.py reads it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.parsers.param_types import is_text, typed_value
from engine.parsers.xml_value import AFTER_VALUE, value_end

# the canonical Qwen3 JSON call up to its arguments: {"name": "...", "arguments": (or "parameters")
_JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_PLAIN = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]+')  # no quote, backslash, control character, surrogate
_HEAD_LIMIT = 512  # a body this long without that head is another layout: no streaming
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>")


def arguments_json(arguments: dict[str, Any]) -> str:
    """A call's arguments as every protocol sends them (and as the streamed pieces add up to)."""
    return json.dumps(arguments, ensure_ascii=False)


def partial_arguments(text: str) -> dict[str, Any]:
    """The members that are whole in the start of a JSON object (a call's arguments as far as they were
    written): a string, number or literal is taken once it ends, a key without its value is left out, open
    objects and arrays are closed. `{"city": "Paris", "days": ` -> {"city": "Paris"}."""
    stack: list[str] = []  # the open containers' closing characters
    cut, closers = 0, ""  # the last point where a value ended, and what closes the containers open there
    expect_key = False  # inside an object, the next string is a key
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            end = string_end(text, i)
            if end < 0:  # a string the text ends inside
                break
            if not expect_key:
                cut, closers = end, "".join(reversed(stack))
            i = end
            continue
        if c in "{[":
            stack.append("}" if c == "{" else "]")
            expect_key = c == "{"
            cut, closers = i + 1, "".join(reversed(stack))
        elif c in "}]":
            if not stack:
                break
            stack.pop()
            expect_key = False
            cut, closers = i + 1, "".join(reversed(stack))
        elif c == ",":
            expect_key = bool(stack) and stack[-1] == "}"
        elif c == ":":
            expect_key = False
        elif not c.isspace():  # a number or literal: whole once a delimiter follows it
            end = i
            while end < len(text) and text[end] not in ",}] \t\r\n":
                end += 1
            if end < len(text):
                cut, closers = end, "".join(reversed(stack))
            i = end
            continue
        i += 1
    try:
        value = json.loads(text[:cut] + closers)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def string_end(text: str, start: int) -> int:
    """Past the closing quote of the JSON string whose opening quote is at `start`; -1 if the text ends
    inside it."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return -1


def _escaped(text: str) -> str:
    """`text` as the inside of a JSON string, escaped as json.dumps escapes (character by character)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class CallStream:
    """One call's body -> (name once, argument pieces). `name` is None until the call streams; `broken`
    once the text leaves the form (nothing more streams; the finished call, if it parses, completes it)."""

    def __init__(self, schemas: dict[str, dict[str, Any]]):
        self.schemas = schemas
        self.body = ""
        self.name: str | None = None
        self.sent = ""  # the argument text streamed so far
        self.broken = False
        self._form: _JsonArguments | _XmlArguments | None = None
        self._read = 0  # body characters handed to the form

    def feed(self, text: str) -> tuple[str | None, str]:
        """(the name, when this feed makes it known; the new argument text)."""
        self.body += text
        if self.broken:
            return None, ""
        started = self.name is None
        if self._form is None and not self._begin():
            return None, ""
        piece = self._form.feed(self.body[self._read :])
        self._read = len(self.body)
        self.broken = self._form.broken
        self.sent += piece
        return (self.name if started else None), piece

    def _begin(self) -> bool:
        stripped = self.body.lstrip()
        if not stripped:
            return False
        if stripped[0] == "{":
            m = _JSON_HEAD.match(self.body)
            if m is None:
                self.broken = len(self.body) > _HEAD_LIMIT or _other_layout(self.body)
                return False
            rest = self.body[m.end() :]
            if not rest:
                return False
            if rest[0] != "{":  # arguments as a string (or broken): the call comes whole
                self.broken = True
                return False
            try:
                self.name = json.loads(f'"{m.group(1)}"')
            except json.JSONDecodeError:
                self.broken = True
                return False
            self._form, self._read = _JsonArguments(), m.end()
            return True
        m = _FUNCTION.match(self.body)
        if m is None:
            if stripped.startswith("<function="):  # its name read up to ">": a newline or no name is not XML
                self.broken = ">" in stripped or "\n" in stripped
            else:
                self.broken = not "<function=".startswith(stripped)
            return False
        self.name = m.group(1).strip()
        self._form, self._read = _XmlArguments(self.schemas.get(self.name, {})), m.end()
        return True


_FIRST_KEY = re.compile(r'\s*\{\s*"((?:[^"\\]|\\.)*)"')
_SECOND_KEY = re.compile(r'\s*\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"((?:[^"\\]|\\.)*)"')


def _other_layout(body: str) -> bool:
    """The JSON call's keys, as far as read, are not `name` then `arguments` (or `parameters`)."""
    first = _FIRST_KEY.match(body)
    if first is not None and first.group(1) != "name":
        return True
    second = _SECOND_KEY.match(body)
    return second is not None and second.group(1) not in ("arguments", "parameters")


class _JsonArguments:
    """A JSON object's raw text -> json.dumps's text of the same value, as far as it is certain."""

    def __init__(self):
        self.stack: list[
            list[str]
        ] = []  # [kind, phase]: ["obj", "key" | "colon" | "value" | "next"], ["arr", ...]
        self.broken = False
        self.done = False
        self._scalar: str | None = None  # "string", "key", "number", "literal"
        self._buf = ""  # a key, number or literal being read
        self._escape: str | None = None  # "\\" after a backslash, "u...." while reading a \u escape
        self._high: str | None = None  # a high surrogate waiting for its low half
        self._first = True  # the container just opened has no member yet

    def feed(self, text: str) -> str:
        out: list[str] = []
        i = 0
        while i < len(text) and not (self.broken or self.done):
            if self._scalar in ("string", "key") and self._escape is None and self._high is None:
                run = _PLAIN.match(text, i)  # characters json.dumps leaves as they are: taken at once
                if run is not None:
                    if self._scalar == "key":
                        self._buf += run.group()
                    else:
                        out.append(run.group())
                    i = run.end()
                    continue
            self._char(text[i], out)
            i += 1
        return "".join(out)

    def _char(self, c: str, out: list[str]) -> None:
        if self._scalar in ("string", "key"):
            self._string_char(c, out)
            return
        if self._scalar in ("number", "literal"):
            if (c.isalnum() or c in "+-.") and not (self._scalar == "literal" and c in "+."):
                self._buf += c
                return
            try:
                value = json.loads(self._buf)
            except json.JSONDecodeError:
                self.broken = True
                return
            out.append(json.dumps(value))
            self._scalar, self._buf = None, ""
            self._after_value()
        if c in " \t\r\n":
            return
        if not self.stack:  # the arguments object itself
            if c != "{":
                self.broken = True
                return
            self._open("obj", "{", out)
            return
        kind, phase = self.stack[-1]
        if kind == "obj" and phase == "key":
            if c == '"':
                self._scalar, self._buf = "key", ""
            elif c == "}" and self._first:
                self._close("}", out)
            else:
                self.broken = True
        elif kind == "obj" and phase == "colon":
            if c == ":":
                self.stack[-1][1] = "value"
            else:
                self.broken = True
        elif phase == "value" or (kind == "arr" and phase == "first"):
            if kind == "arr" and phase == "first" and c == "]":
                self._close("]", out)
            else:
                self._value_start(c, out)
        elif phase == "next":
            if c == ",":
                out.append(", ")
                self.stack[-1][1] = "key" if kind == "obj" else "value"
                self._first = False
            elif c == ("}" if kind == "obj" else "]"):
                self._close(c, out)
            else:
                self.broken = True
        else:
            self.broken = True

    def _open(self, kind: str, c: str, out: list[str]) -> None:
        out.append(c)
        self.stack.append([kind, "key" if kind == "obj" else "first"])
        self._first = True

    def _close(self, c: str, out: list[str]) -> None:
        out.append(c)
        self.stack.pop()
        self._first = False
        self._after_value()

    def _after_value(self) -> None:
        if not self.stack:
            self.done = True
        else:
            self.stack[-1][1] = "next"

    def _value_start(self, c: str, out: list[str]) -> None:
        if c == "{":
            self._open("obj", c, out)
        elif c == "[":
            self._open("arr", c, out)
        elif c == '"':
            out.append('"')
            self._scalar = "string"
        elif c in "-0123456789":
            self._scalar, self._buf = "number", c
        elif c.isalpha():  # true, false, null (and json's NaN / Infinity)
            self._scalar, self._buf = "literal", c
        else:
            self.broken = True

    def _string_char(self, c: str, out: list[str]) -> None:
        if self._escape is None:
            if c == "\\":
                self._escape = "\\"
                return
            if c == '"':
                self._end_string(out)
                return
            if c < " ":  # a raw control character: not JSON
                self.broken = True
                return
            self._emit_char(c, out)
            return
        if self._escape == "\\":
            if c == "u":
                self._escape = "u"
                return
            decoded = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
            if c not in decoded:
                self.broken = True
                return
            self._escape = None
            self._emit_char(decoded[c], out)
            return
        self._escape += c  # "u" + hex digits
        if len(self._escape) < 5:
            return
        try:
            char = chr(int(self._escape[1:], 16))
        except ValueError:
            self.broken = True
            return
        self._escape = None
        self._emit_char(char, out)

    def _emit_char(self, char: str, out: list[str]) -> None:
        if self._high is not None:
            high, self._high = self._high, None
            if "\udc00" <= char <= "\udfff":  # the pair makes one character, as json.loads makes it
                char = chr(0x10000 + ((ord(high) - 0xD800) << 10) + (ord(char) - 0xDC00))
            else:
                self._put(high, out)
        if "\ud800" <= char <= "\udbff":
            self._high = char
            return
        self._put(char, out)

    def _put(self, char: str, out: list[str]) -> None:
        if self._scalar == "key":
            self._buf += char
        else:
            out.append(_escaped(char))

    def _end_string(self, out: list[str]) -> None:
        if self._high is not None:
            self._put(self._high, out)
            self._high = None
        if self._scalar == "key":
            out.append(json.dumps(self._buf, ensure_ascii=False) + ": ")  # (", " went out at the comma)
            self._scalar, self._buf = None, ""
            self.stack[-1][1] = "colon"
            return
        out.append('"')
        self._scalar = None
        self._after_value()


class _XmlArguments:
    """`<parameter=k>v</parameter>...</function>` -> the JSON object of the typed values, as it streams."""

    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        self.text = ""
        self.pos = 0
        self.broken = False
        self.done = False
        self._param: str | None = None  # the parameter whose value is being read
        self._string = False  # ... and it streams as a string
        self._value_started = False  # its first character is read (a leading newline dropped)
        self._count = 0  # parameters sent
        self._opened = False

    def feed(self, text: str) -> str:
        self.text += text
        out: list[str] = []
        if not self._opened:
            out.append("{")
            self._opened = True
        while not (self.broken or self.done):
            if self._param is None:
                if not self._next(out):
                    break
            elif not self._value(out):
                break
        return "".join(out)

    def _next(self, out: list[str]) -> bool:
        rest = self.text[self.pos :]
        stripped = rest.lstrip()
        if not stripped:
            return False
        if stripped.startswith(AFTER_VALUE[1:]):  # </function>, or </tool_call> where it is left out
            out.append("}")
            self.done = True
            return False
        m = _PARAMETER.match(rest)
        if m is None:
            if not any(tag.startswith(stripped[: len(tag)]) for tag in AFTER_VALUE) or (
                stripped.startswith("<parameter=") and ("\n" in stripped)
            ):
                self.broken = True
            return False
        self._param = m.group(1).strip()
        self.pos += m.end()
        self._string = is_text(self.schema.get(self._param, ()))
        self._value_started = False
        out.append((", " if self._count else "") + json.dumps(self._param, ensure_ascii=False) + ": ")
        self._count += 1
        if self._string:
            out.append('"')
        return True

    def _value(self, out: list[str]) -> bool:
        end, resume, certain = value_end(self.text, self.pos, self.schema.keys())
        if not self._string:
            if end is None:
                return False
            typed = typed_value(self.text[self.pos : end], self.schema.get(self._param, ()))
            out.append(json.dumps(typed, ensure_ascii=False))
            self.pos, self._param = resume, None
            return True
        if not self._value_started:
            if self.pos >= len(self.text):
                return False
            if self.text[self.pos] == "\n":
                self.pos += 1
            self._value_started = True
        if end is not None:
            value = self.text[self.pos : end]
            out.append(_escaped(value[:-1] if value.endswith("\n") else value) + '"')
            self.pos, self._param = resume, None
            return True
        if certain > self.pos:  # (what may be the closing tag, or the newline before it, is held back)
            out.append(_escaped(self.text[self.pos : certain]))
            self.pos = certain
        return False
