"""The JSON types a tool's parameter takes, read from its schema, and an XML parameter's text typed by them.

Qwen3.5's XML calls write every value as text (`<parameter=days>\n3\n</parameter>`); the tool's JSON schema
says what it is. Schemas as clients send them, not only `{"type": "integer"}`:
* `"type": ["integer", "null"]`;
* `anyOf` / `oneOf` / `allOf` branches (Pydantic's `Optional[int]` is `{"anyOf": [{"type": "integer"},
  {"type": "null"}]}`, what FastMCP servers publish);
* `$ref` into the tool's own `$defs` / `definitions` (a Pydantic model as a parameter);
* no type but `enum` / `const` values, `properties` (an object) or `items` (an array).
A parameter whose types are all string (or null), or that the schema does not type, is text: it streams as
written. Any other is read whole: `null` is None, then each type in the schema's order is tried (an integer
written `3`, a number `0.5` or `3`, `true` / `false`, a JSON object or array); text that is none of them
stays text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

KINDS = ("string", "integer", "number", "boolean", "object", "array", "null")
_INTEGER = re.compile(r"-?(?:0|[1-9]\d*)")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_DEPTH = 16  # $ref chains and nested branches followed this deep (a schema may refer to itself)


def param_types(schema: Any, root: Any, depth: int = 0) -> tuple[str, ...]:
    """The JSON types `schema` admits, in its order, without repeats; () when it says none. `root` is the
    tool's whole parameters schema, where `$ref`s point."""
    if not isinstance(schema, dict) or depth > _DEPTH:
        return ()
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return param_types(_pointed(ref, root), root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, str):
        kinds = [kind]
    elif isinstance(kind, list):
        kinds = [k for k in kind if isinstance(k, str)]
    else:
        kinds = [
            k
            for key in ("anyOf", "oneOf", "allOf")
            for branch in (schema.get(key) if isinstance(schema.get(key), list) else [])
            for k in param_types(branch, root, depth + 1)
        ]
        if not kinds:
            values = schema.get("enum") if isinstance(schema.get("enum"), list) else []
            values = values + ([schema["const"]] if "const" in schema else [])
            kinds = [_kind_of(v) for v in values]
        if not kinds and isinstance(schema.get("properties"), dict):
            kinds = ["object"]
        if not kinds and "items" in schema:
            kinds = ["array"]
    return tuple(dict.fromkeys(k for k in kinds if k in KINDS))


def is_text(types: tuple[str, ...]) -> bool:
    """A parameter of these types is text: streamed as written, never converted."""
    return all(k in ("string", "null") for k in types)


def typed_value(value: str, types: tuple[str, ...]) -> Any:
    """An XML parameter's text as its types read it (one newline after the opening tag and one before the
    closing tag dropped); text that is none of them stays a string."""
    value = value[1:] if value.startswith("\n") else value
    value = value[:-1] if value.endswith("\n") else value
    if is_text(types):
        return value
    text = value.strip()
    if text == "null":
        return None
    for kind in types:
        if kind == "string":
            return value
        if kind == "integer" and _INTEGER.fullmatch(text):
            return int(text)
        if kind == "number" and _NUMBER.fullmatch(text):
            number = int(text) if _INTEGER.fullmatch(text) else float(text)
            if math.isfinite(number):
                return number
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind in ("object", "array"):
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            if isinstance(parsed, dict if kind == "object" else list):
                return parsed
    return value


def tool_param_types(parameters: Any) -> dict[str, tuple[str, ...]]:
    """{parameter: its types} for a tool's parameters schema (an object schema with `properties`)."""
    if not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict):
        return {}
    return {name: param_types(prop, parameters) for name, prop in parameters["properties"].items()}


def _pointed(ref: str, root: Any) -> Any:
    """What a local `$ref` (`#/$defs/Name`) points to in `root`; None for any other reference."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object" if isinstance(value, dict) else ""
