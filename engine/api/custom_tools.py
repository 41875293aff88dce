"""OpenAI's custom tools (`{"type": "custom", "name", "description", "format"}`): a tool that takes one
free string rather than JSON arguments — Codex's apply_patch takes a patch.

The model, trained on function calls, is shown a function of one string parameter, `input`, whose
description tells the `format` grammar when one is given; its call of that function comes back as a custom
tool call whose `input` is the string, and a custom tool call in the conversation goes to the chat template
as that function's call. Chat completions and the Responses API share this.

A grammar format holds the input to it (engine/api/structured.py): a tool with one that binds counts as
strict, so every call the model writes is held to its tool's definition. A Lark format binds where the
model writes its calls' parameters as text (Qwen3.5, Qwen3-Coder: `<parameter=input>`), a regex format in
either call form; in the JSON form a Lark format is told, not enforced (the input is a JSON string there).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from engine.api.errors import ApiError

INPUT = "input"
_FORMATS = '{"type": "text"} or {"type": "grammar", "syntax": "lark" | "regex", "definition": ...}'


def custom_function(tool: Any, where: str) -> dict[str, Any]:
    """A custom tool's definition (name, description, format) as the function spec the template lists."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ApiError(400, f"{where} needs a string 'name'", "tools")
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise ApiError(400, f"{where}.description must be a string", "tools")
    fmt = tool.get("format", {"type": "text"})
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if syntax not in ("lark", "regex") or not isinstance(definition, str):
            raise ApiError(400, f"{where}.format must be {_FORMATS}", "tools")
        _check_definition(syntax, definition, where)
        description += f"\n\nThe input follows this {syntax} grammar:\n{definition}"
    elif kind != "text":
        raise ApiError(400, f"{where}.format must be {_FORMATS}", "tools")
    parameters = {
        "type": "object",
        "properties": {INPUT: {"type": "string", "description": "the tool's whole input, as free text"}},
        "required": [INPUT],
    }
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": description.strip(), "parameters": parameters},
    }


def _check_definition(syntax: str, definition: str, where: str) -> None:
    """A format's grammar compiles (llguidance, OpenAI's dialect), else a 400 naming the tool."""
    error = _grammar_error(syntax, definition)
    if error:
        raise ApiError(
            400, f"{where}.format.definition is not a {syntax} grammar llguidance reads: {error}", "tools"
        )


@functools.lru_cache(maxsize=64)
def _grammar_error(syntax: str, definition: str) -> str:
    """llguidance's first line about the grammar, "" when it compiles (kept: an agent such as Codex sends the
    same apply_patch grammar with every request)."""
    from engine.structured.grammars import llguidance

    llg = llguidance()
    try:
        lark = f"start: /{llg.regex_to_lark(definition)}/" if syntax == "regex" else definition
        error = llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_lark(lark))
    except (ValueError, TypeError, RuntimeError) as e:
        error = str(e)
    return error.strip().splitlines()[0] if error.strip() else ""


def _custom_tools(tools: Any) -> list[dict[str, Any]]:
    """The definitions of a request's custom tools (Responses: the tool itself; chat completions: its
    `custom` object), as sent."""
    out = []
    for t in tools or ():
        if isinstance(t, dict) and t.get("type") == "custom" and isinstance(t.get("custom", t), dict):
            out.append(t.get("custom", t))
    return out


def custom_formats(tools: Any) -> dict[str, tuple[str, str]]:
    """The custom tools' grammar formats by name, (syntax, definition) (the tools as sent; checked by
    custom_function)."""
    out = {}
    for tool in _custom_tools(tools):
        fmt = tool.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(tool.get("name"), str):
            out[tool["name"]] = (fmt.get("syntax"), fmt.get("definition"))
    return out


def custom_input(arguments: dict[str, Any]) -> str:
    """A call's parsed arguments as the custom tool's input: its `input` string (else a lone string
    argument, else the arguments as JSON)."""
    if isinstance(arguments.get(INPUT), str):
        return arguments[INPUT]
    values = list(arguments.values())
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return json.dumps(arguments, ensure_ascii=False)


# the inside of a JSON string up to an escape not yet whole, or its closing quote
_STRING_PART = re.compile(r'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')


class InputStream:
    """A custom tool call's input as it streams: the call's argument pieces (`{"input": "...`, as
    engine/parsers/call_stream.py writes them) read back into the input's own text, as far as whole.
    Arguments that do not begin with the input string give nothing (the input comes whole at the end)."""

    PREFIX = '{"input": "'

    def __init__(self) -> None:
        self.args = ""
        self._pos = 0  # the arguments' characters read into the input
        self._ended = False

    def feed(self, piece: str) -> str:
        self.args += piece
        if self._ended:
            return ""
        if not self._pos:
            if not self.args.startswith(self.PREFIX):
                self._ended = not self.PREFIX.startswith(self.args)
                return ""
            self._pos = len(self.PREFIX)
        whole = _STRING_PART.match(self.args, self._pos)
        text = json.loads(f'"{whole.group()}"') if whole.end() > self._pos else ""
        self._pos = whole.end()
        self._ended = self.args.startswith('"', self._pos)  # the input's closing quote
        return text


def custom_arguments(text: Any, where: str) -> dict[str, str]:
    """A custom tool call's `input`, from the conversation, as the arguments of its function call."""
    if not isinstance(text, str):
        raise ApiError(400, f"{where} must be a string (the custom tool's input)", "input")
    return {INPUT: text}


def custom_names(tools: Any) -> frozenset[str]:
    """The names of a request's custom tools (its `tools` as sent; checked elsewhere)."""
    return frozenset(tool.get("name") for tool in _custom_tools(tools))
