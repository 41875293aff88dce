"""Grammars for structured outputs, as llguidance Lark text: JSON schemas, regexes, choices, tool calls.

Every builder returns a string `GrammarCompiler.matcher` compiles. JSON comes out compact with the
separators the Qwen templates write (`{"a": 1, "b": [2, 3]}`): no free whitespace, so a model cannot wander
into endless newlines inside a value the grammar still allows.
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import NinferError

# llguidance's JSON compiler options: fixed separators, no free whitespace; keywords it does not implement
# are ignored rather than refused (a schema's "format": "email" still constrains the rest)
JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}


def llguidance():
    """The llguidance module (imported on first use: plain generation never needs it)."""
    try:
        import llguidance as llg
    except ImportError as e:
        raise NinferError(
            "structured outputs need the llguidance package (a dependency of ninfer): pip install "
            "'llguidance>=1.0,<2'"
        ) from e
    return llg


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json_value(schema: dict[str, Any]) -> str:
    """A `%json {...}` non-terminal for `schema`, with JSON_OPTIONS under the schema's own x-guidance."""
    options = {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def json_schema(schema: Any) -> str:
    if not isinstance(schema, dict):
        raise NinferError("a JSON schema must be an object")
    return "start: " + _json_value(schema)


def json_object() -> str:
    return json_schema({"type": "object"})


def regex(pattern: str) -> str:
    return "start: /" + llguidance().regex_to_lark(pattern) + "/"


def choice(options: list[str]) -> str:
    if not options or not all(isinstance(o, str) for o in options):
        raise NinferError("a choice must be a non-empty list of strings")
    return "start: " + " | ".join(_literal(o) for o in options)


def grammar(text: str) -> str:
    """A grammar the user wrote: llguidance Lark (`start: ...`) as it is, or llama.cpp's GBNF
    (`root ::= ...`) converted to it."""
    llguidance()
    from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

    try:
        return any_to_lark(text)
    except GbnfToLarkError as e:
        raise NinferError(f"the grammar is neither Lark nor GBNF: {e}") from e


def tool_call_form(chat_template: str | None) -> str:
    """How the model writes a call: "xml" (Qwen3.5, Qwen3-Coder: `<function=name><parameter=p>`) or "json"
    (Qwen3: `{"name": ..., "arguments": {...}}`), read off the chat template that renders them."""
    return "xml" if chat_template and "<function=" in chat_template else "json"


def _function(tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fn = tool.get("function", tool)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise NinferError("every tool needs a string name")
    params = fn.get("parameters") or fn.get("input_schema") or {"type": "object"}
    if not isinstance(params, dict):
        raise NinferError(f"the parameters of tool '{name}' must be a JSON schema object")
    if "properties" in params and "additionalProperties" not in params:
        # a call passes the parameters the tool declares (as the XML form, parameter by parameter)
        params = {**params, "additionalProperties": False}
    return name, params


def tool_calls(tools: list[dict[str, Any]], name: str | None, parallel: bool, form: str) -> str:
    """Output that is nothing but tool calls: one (parallel=False) or more, of the tool `name` or of any
    of `tools`, each call's arguments following its tool's schema. `form`: tool_call_form()."""
    functions = [_function(t) for t in tools]
    if name is not None:
        functions = [f for f in functions if f[0] == name]
        if not functions:
            raise NinferError(f"tool_choice names the tool '{name}', which is not among the tools")
    if not functions:
        raise NinferError("a forced tool call needs at least one tool")
    rules = ['start: call ("\\n" call)*' if parallel else "start: call"]
    alternatives = " | ".join(f"fn_{i}" for i in range(len(functions)))
    if form == "json":
        rules.append(f'call: "<tool_call>\\n" ({alternatives}) "\\n</tool_call>"')
        for i, (fn_name, params) in enumerate(functions):
            call = {
                "type": "object",
                "properties": {"name": {"const": fn_name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            rules.append(f"fn_{i}: {_json_value(call)}")
    else:
        rules.append(f'call: "<tool_call>\\n" ({alternatives}) "</tool_call>"')
        rules.append('text_value[stop="\\n</parameter>\\n"]: /(?s:.*)/')
        for i, (fn_name, params) in enumerate(functions):
            rules.extend(_xml_function(i, fn_name, params))
    return "\n".join(rules)


_END = '"\\n</parameter>\\n"'


def _xml_function(i: int, fn_name: str, params: dict[str, Any]) -> list[str]:
    """`<function=name>` with its parameters in the schema's order, the required ones present, each value
    typed by its schema."""
    props = params.get("properties") or {}
    required = set(params.get("required") or ())
    parts, rules = [], []
    for j, (pname, pschema) in enumerate(props.items()):
        rule = f"p_{i}_{j}"
        value = _xml_value(pschema if isinstance(pschema, dict) else {})
        open_tag = _literal(f"<parameter={pname}>\n")
        rules.append(f"{rule}: {open_tag} {value}")
        parts.append(rule if pname in required else f"{rule}?")
    body = " ".join(parts)
    open_tag = _literal(f"<function={fn_name}>\n")
    rules.insert(0, f'fn_{i}: {open_tag} {body} "</function>\\n"')
    return rules


def _xml_value(schema: dict[str, Any]) -> str:
    """A parameter's value as the XML form writes it: strings bare (an enum's one of its words), every
    other type as its JSON text (numbers within their bounds, booleans, objects, arrays)."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "(" + " | ".join(_literal(v) for v in enum) + ") " + _END
    if schema.get("type") in ("integer", "number", "boolean", "object", "array"):
        return _json_value(schema) + " " + _END
    return "text_value"
