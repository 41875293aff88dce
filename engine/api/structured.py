"""Structured outputs in the protocols: the request fields that constrain the output, as one grammar.

OpenAI: `response_format` (json_object, json_schema), vLLM's `structured_outputs` ({json | regex | choice
| grammar}) and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, and a forced
`tool_choice` ("required": one call or more, one with `parallel_tool_calls: false`; a named function: one
call of it). Anthropic: `output_config.format` / `output_format` ({"type": "json_schema", "schema": ...})
and a forced `tool_choice` ({"type": "any"}: one call or more, one with `disable_parallel_tool_use`;
{"type": "tool", "name": ...}: one call of it). llama.cpp's native routes: `grammar` and `json_schema`
(taken on the OpenAI routes too, as llama-server does).
"""

from __future__ import annotations

import json
from typing import Any

from engine.api.custom_tools import custom_formats
from engine.api.errors import ApiError
from engine.errors import NinferError
from engine.structured import grammars
from engine.tokenizer import Tokenizer

_GUIDED = {
    "json": "guided_json",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
}


def openai_text_grammar(body: dict) -> str | None:
    """The grammar a text completion asks for; None when its output is free."""
    return _one(_formats(body), "response_format, structured_outputs (or guided_*) and grammar / json_schema")


def llama_cpp_grammar(body: dict) -> str | None:
    """llama.cpp's `grammar` (GBNF, or llguidance Lark) or `json_schema`; None when the output is free."""
    asked = []
    text = body.get("grammar")
    if text is not None and text != "":
        if not isinstance(text, str):
            raise ApiError(400, "'grammar' must be a string (GBNF or Lark)", "grammar")
        asked.append(_built(grammars.grammar, text))
    if body.get("json_schema") is not None:
        asked.append(_built(grammars.json_schema, _schema(body["json_schema"], "json_schema")))
    return _one(asked, "grammar and json_schema")


def openai_grammar(body: dict, tools: list[dict] | None, tokenizer: Tokenizer) -> str | None:
    """The grammar a chat completion asks for (a format or forced tool calls); None when its output is free."""
    asked = _formats(body)
    forced = _openai_forced_calls(body, tools, tokenizer, nested=True)
    return _one(
        asked + ([forced] if forced else []),
        "response_format, structured_outputs (or guided_*), grammar / json_schema and a forced tool_choice",
    ) or _strict_calls(tools, tokenizer, _custom_formats(body, tools))


def responses_grammar(body: dict, tools: list[dict] | None, tokenizer: Tokenizer) -> str | None:
    """The Responses API's `text.format` ({"type": "json_schema", "schema": ...} or json_object) or a forced
    `tool_choice` ("required", {"type": "function", "name": ...})."""
    asked = []
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            asked.append(grammars.json_object())
        elif kind == "json_schema":
            asked.append(_built(grammars.json_schema, _schema(fmt.get("schema"), "text.format.schema")))
        elif kind != "text":
            raise ApiError(400, "'text.format.type' must be text, json_object or json_schema", "text")
    forced = _openai_forced_calls(body, tools, tokenizer, nested=False)
    asked += [forced] if forced else []
    return _one(asked, "text.format and a forced tool_choice") or _strict_calls(
        tools, tokenizer, _custom_formats(body, tools)
    )


def _openai_forced_calls(
    body: dict, tools: list[dict] | None, tokenizer: Tokenizer, nested: bool
) -> str | None:
    """OpenAI's `tool_choice` "required" or a named function (chat completions: {"type": "function",
    "function": {"name": ...}}; Responses: {"type": "function", "name": ...}; "custom" in place of
    "function" for a custom tool) as a grammar; None for auto / none. A named function is called once (as
    OpenAI and vLLM do); "required": as many calls as the model writes, one with `parallel_tool_calls:
    false`."""
    choice = body.get("tool_choice")
    if choice in (None, "auto", "none"):
        return None
    shape = (
        '{"type": "function", "function": {"name": ...}}' if nested else '{"type": "function", "name": ...}'
    )
    name, kind = None, choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom"):  # a custom tool is forced as the function it is shown as
        holder = choice.get(kind) if nested else choice
        name = holder.get("name") if isinstance(holder, dict) else None
    valid = isinstance(name, str)
    if choice != "required" and not valid:
        raise ApiError(400, f"'tool_choice' must be none, auto, required or {shape}", "tool_choice")
    if not tools:
        raise ApiError(400, "'tool_choice' forces a tool call, but the request has no 'tools'", "tool_choice")
    parallel = name is None and body.get("parallel_tool_calls", True) is not False
    formats = _custom_formats(body, tools)
    return _built(grammars.tool_calls, tools, name, parallel, grammars.call_syntax(tokenizer), formats)


def anthropic_grammar(body: dict, tools: list[dict] | None, tokenizer: Tokenizer) -> str | None:
    asked = []
    config = body.get("output_config")
    fmt = (config or {}).get("format") if isinstance(config, dict) else None
    for name, value in (("output_config.format", fmt), ("output_format", body.get("output_format"))):
        if value is not None:
            if not isinstance(value, dict) or value.get("type") != "json_schema":
                raise ApiError(400, f'\'{name}\' must be {{"type": "json_schema", "schema": {{...}}}}')
            asked.append(_built(grammars.json_schema, _schema(value.get("schema"), f"{name}.schema")))
    choice = body.get("tool_choice") or {}
    if choice.get("type") in ("any", "tool") and tools:
        name = choice.get("name") if choice["type"] == "tool" else None
        if choice["type"] == "tool" and not isinstance(name, str):
            raise ApiError(400, "'tool_choice' of type 'tool' needs the tool's 'name'")
        parallel = name is None and not choice.get("disable_parallel_tool_use", False)
        asked.append(_built(grammars.tool_calls, tools, name, parallel, grammars.call_syntax(tokenizer)))
    asked_one = _one(asked, "output_config.format (or output_format) and a forced tool_choice")
    return asked_one or _strict_calls(tools, tokenizer)


def _strict_calls(
    tools: list[dict] | None, tokenizer: Tokenizer, formats: grammars.InputFormats | None = None
) -> str | None:
    """With a tool marked `strict`, or a custom tool with a grammar format (and no other format), the reply
    is free but each call in it is held to its tool's definition: every tool's, once one is strict. None
    without such a tool."""
    syntax = grammars.call_syntax(tokenizer)
    # a Lark format binds only where calls are XML (in JSON the input is a JSON string): none to hold here
    formats = {n: f for n, f in (formats or {}).items() if f[0] == "regex" or syntax.form == "xml"}
    if not tools or not (formats or any(_is_strict(t) for t in tools)):
        return None
    return _built(grammars.tool_calls_in_text, tools, syntax, formats)


def _custom_formats(body: dict, tools: list[dict] | None) -> grammars.InputFormats:
    """The grammar formats of the request's custom tools that are among `tools` (none once tool_choice is
    none: the tools are not shown)."""
    shown = {t.get("function", t).get("name") for t in tools or () if isinstance(t, dict)}
    return {n: f for n, f in custom_formats(body.get("tools")).items() if n in shown}


def _is_strict(tool: dict) -> bool:
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    return isinstance(fn, dict) and fn.get("strict") is True


def _formats(body: dict) -> list[str]:
    """What the OpenAI routes take: response_format, vLLM's structured outputs, and llama-server's own
    `grammar` / `json_schema` fields (which it takes on its OpenAI routes too)."""
    return [
        g for g in (_response_format(body), _vllm_structured(body), llama_cpp_grammar(body)) if g is not None
    ]


def _response_format(body: dict) -> str | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return grammars.json_object()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise ApiError(
                400, "'response_format.json_schema' must be an object with a 'schema'", "response_format"
            )
        return _built(grammars.json_schema, _schema(spec.get("schema"), "response_format.json_schema.schema"))
    raise ApiError(400, "'response_format.type' must be text, json_object or json_schema", "response_format")


def _vllm_structured(body: dict) -> str | None:
    spec = body.get("structured_outputs")
    if spec is not None and not isinstance(spec, dict):
        raise ApiError(400, "'structured_outputs' must be an object", "structured_outputs")
    spec = {k: v for k, v in (spec or {}).items() if v is not None}
    spec.update({k: body[old] for k, old in _GUIDED.items() if body.get(old) is not None})
    if not spec:
        return None
    unknown = sorted(set(spec) - set(_GUIDED))
    if unknown or len(spec) != 1:
        raise ApiError(
            400,
            "'structured_outputs' takes exactly one of json, regex, choice or grammar"
            + (f" (got {', '.join(unknown)})" if unknown else ""),
            "structured_outputs",
        )
    ((kind, value),) = spec.items()
    if kind == "json":
        return _built(grammars.json_schema, _schema(value, "structured_outputs.json"))
    if kind == "choice":
        return _built(grammars.choice, value)
    if not isinstance(value, str):
        raise ApiError(400, f"'structured_outputs.{kind}' must be a string", "structured_outputs")
    return _built(grammars.regex if kind == "regex" else grammars.grammar, value)


def _schema(value: Any, where: str) -> dict:
    if isinstance(value, str):  # some clients send the schema as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ApiError(400, f"'{where}' is not valid JSON ({e.msg})") from e
    if not isinstance(value, dict):
        raise ApiError(400, f"'{where}' must be a JSON schema object")
    return value


def _built(builder, *args) -> str:
    try:
        return builder(*args)
    except NinferError as e:
        raise ApiError(400, str(e)) from e


def _one(asked: list[str], names: str) -> str | None:
    if len(asked) > 1:
        raise ApiError(400, f"ask for one output format at a time: {names} each constrain the whole output")
    return asked[0] if asked else None
