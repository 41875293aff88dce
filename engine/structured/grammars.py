"""Grammars for structured outputs, as llguidance Lark text: JSON schemas, regexes, choices, tool calls.

Every builder returns a string `GrammarCompiler.matcher` compiles: Lark text, or, where a tool call holds
a custom tool's own Lark grammar, llguidance's top-level JSON (`{"grammars": [main, named ones]}`, the
main one referring to the others as `@name`). JSON comes out compact with the separators the Qwen
templates write (`{"a": 1, "b": [2, 3]}`): no free whitespace, so a model cannot wander into endless
newlines inside a value the grammar still allows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.errors import NinferError
from engine.parsers.param_types import is_text, param_types
from engine.tokenizer import Tokenizer

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
    if not isinstance(options, (list, tuple)) or not options or not all(isinstance(o, str) for o in options):
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
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exceptions ("No 'root' rule found")
        raise NinferError(f"the grammar is neither Lark nor GBNF: {e}") from e


@dataclass(frozen=True)
class CallSyntax:
    """How a model writes a tool call: `form` "json" (Qwen3: `{"name": ..., "arguments": {...}}`) or
    "xml" (Qwen3.5, Qwen3-Coder: `<function=name><parameter=p>`), inside `<tool_call>` ... `</tool_call>`;
    `open` / `close`: those tags as grammar terms (a token reference where the tokenizer has the tag as a
    token of its own, which llguidance counts as special: never spelled out in text)."""

    form: str = "json"
    open: str = '"<tool_call>"'
    close: str = '"</tool_call>"'

    @property
    def open_is_token(self) -> bool:
        return self.open.startswith("<[")


def call_syntax(tokenizer: Tokenizer | None) -> CallSyntax:
    """The CallSyntax of a model: the form from the chat template that renders calls, the tags from its
    tokenizer's added tokens."""
    template = tokenizer.chat_template if tokenizer is not None else None
    form = "xml" if template and "<function=" in template else "json"
    added = (
        {t.content: i for i, t in tokenizer.backend.get_added_tokens_decoder().items()} if tokenizer else {}
    )

    def term(tag: str) -> str:
        return f"<[{added[tag]}]>" if tag in added else _literal(tag)

    return CallSyntax(form, term("<tool_call>"), term("</tool_call>"))


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


# a custom tool's input format (engine/api/custom_tools.py): ("lark" | "regex", definition), by tool name
InputFormats = dict[str, tuple[str, str]]
INPUT = "input"  # the one parameter a custom tool is shown with


def tool_calls(
    tools: list[dict[str, Any]],
    name: str | None,
    parallel: bool,
    syntax: CallSyntax,
    formats: InputFormats | None = None,
) -> str:
    """Output that is nothing but tool calls: one (parallel=False) or more, of the tool `name` or of any
    of `tools`, each call's arguments following its tool's schema (a custom tool's `input` its format)."""
    functions = [_function(t) for t in tools]
    if name is not None:
        functions = [f for f in functions if f[0] == name]
        if not functions:
            raise NinferError(f"tool_choice names the tool '{name}', which is not among the tools")
    if not functions:
        raise NinferError("a forced tool call needs at least one tool")
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    rules, subs = _call_body(functions, syntax, formats or {})
    return _with_subgrammars([start, f"call: {syntax.open} call_body", *rules], subs)


def tool_calls_in_text(
    tools: list[dict[str, Any]], syntax: CallSyntax, formats: InputFormats | None = None
) -> str:
    """Free text with tool calls anywhere in it (strict tools in auto mode): whatever the model writes, but
    from each `<tool_call>` on, a call of one of `tools` with arguments its schema allows."""
    functions = [_function(t) for t in tools]
    if not functions:
        raise NinferError("strict tool calls need at least one tool")
    if syntax.open_is_token:  # text can never hold the tag's token, so the text ends where it comes
        rules = ["start: segment* FREE", f"segment: FREE {syntax.open} call_body", "FREE: /(?s:.*)/"]
    else:  # text up to the first spelled-out tag (lazy: the call starts there), and text holding none
        rules = [
            "start: segment* FREE",
            "segment: call_head call_body",
            f"call_head[lazy]: FREE {syntax.open}",
            "FREE: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/",
        ]
    body, subs = _call_body(functions, syntax, formats or {})
    return _with_subgrammars(rules + body, subs)


def _with_subgrammars(rules: list[str], subs: dict[str, str]) -> str:
    """Lark text, or llguidance's top-level JSON where the rules refer to named grammars (`@name`)."""
    main = "\n".join(rules)
    if not subs:
        return main
    named = [{"name": name, "lark_grammar": text} for name, text in subs.items()]
    return json.dumps({"grammars": [{"lark_grammar": main}, *named]})


def _call_body(
    functions: list[tuple[str, dict[str, Any]]], syntax: CallSyntax, formats: InputFormats
) -> tuple[list[str], dict[str, str]]:
    """Rules for what follows `<tool_call>`: one call of one of `functions`, through `</tool_call>`; and
    the named grammars they refer to (custom tools' Lark formats, XML form only: in the JSON form the
    input is a JSON string, held to a regex format but not to a Lark one)."""
    alternatives = " | ".join(f"fn_{i}" for i in range(len(functions)))
    subs: dict[str, str] = {}
    if syntax.form == "json":
        rules = [f'call_body: "\\n" ({alternatives}) "\\n" {syntax.close}']
        for i, (fn_name, params) in enumerate(functions):
            kind, definition = formats.get(fn_name, ("text", ""))
            if kind == "regex":  # the string's whole text matches it
                params = _with_input(params, {"type": "string", "pattern": f"^(?:{definition})$"})
            call = {
                "type": "object",
                "properties": {"name": {"const": fn_name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            rules.append(f"fn_{i}: {_json_value(call)}")
        return rules, subs
    rules = [
        f'call_body: "\\n" ({alternatives}) {syntax.close}',
        'text_value[stop="\\n</parameter>\\n"]: /(?s:.*)/',
    ]
    for i, (fn_name, params) in enumerate(functions):
        kind, definition = formats.get(fn_name, ("text", ""))
        value = None
        if kind == "regex":
            value = f"/{llguidance().regex_to_lark(definition)}/ {_END}"
        elif kind == "lark":
            subs[f"input_{i}"] = definition
            value = f"@input_{i} {_END}"
        rules.extend(_xml_function(i, fn_name, params, {INPUT: value} if value else {}))
    return rules, subs


def _with_input(params: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    properties = {**(params.get("properties") or {}), INPUT: schema}
    return {**params, "properties": properties}


_END = '"\\n</parameter>\\n"'


def _xml_function(i: int, fn_name: str, params: dict[str, Any], values: dict[str, str]) -> list[str]:
    """`<function=name>` with its parameters in the schema's order, the required ones present, each value
    typed by its schema (or given in `values`: the rule of a custom tool's input format)."""
    props = params.get("properties") or {}
    required = set(params.get("required") or ())
    parts, rules = [], []
    for j, (pname, pschema) in enumerate(props.items()):
        rule = f"p_{i}_{j}"
        value = values.get(pname) or _xml_value(pschema if isinstance(pschema, dict) else {}, params)
        open_tag = _literal(f"<parameter={pname}>\n")
        rules.append(f"{rule}: {open_tag} {value}")
        parts.append(rule if pname in required else f"{rule}?")
    body = " ".join(parts)
    open_tag = _literal(f"<function={fn_name}>\n")
    rules.insert(0, f'fn_{i}: {open_tag} {body} "</function>\\n"')
    return rules


def _xml_value(schema: dict[str, Any], params: dict[str, Any]) -> str:
    """A parameter's value as the XML form writes it: strings bare (an enum's one of its words), a value
    that is no string as its JSON text (numbers within their bounds, booleans, objects, arrays, null where
    the schema allows it; `$ref`s into the tool's `$defs` followed), one that may be either as text (the
    parser types it: engine/parsers/param_types.py)."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "(" + " | ".join(_literal(v) for v in enum) + ") " + _END
    types = param_types(schema, params)
    if types and "string" not in types and not is_text(types):
        defs = {key: params[key] for key in ("$defs", "definitions") if key in params and key not in schema}
        return _json_value({**schema, **defs}) + " " + _END
    return "text_value"
