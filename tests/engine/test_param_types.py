"""XML parameter values typed by the tool's JSON schema in the forms clients send (engine/parsers/param_types.py):
type lists, anyOf / oneOf / allOf (Pydantic's Optional), $ref into $defs, enum / const, bare object and
array schemas."""

from __future__ import annotations

import pytest

from engine.parsers.param_types import is_text, param_types, tool_param_types, typed_value

# a FastMCP / Pydantic v2 tool: Optional fields are anyOf with null, a model field a $ref
PYDANTIC = {
    "type": "object",
    "$defs": {
        "Range": {"type": "object", "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}}},
        "Mode": {"enum": ["fast", "slow"], "type": "string"},
        "Level": {"enum": [1, 2, 3]},
    },
    "properties": {
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "flags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "lines": {"$ref": "#/$defs/Range"},
        "maybe_lines": {"anyOf": [{"$ref": "#/$defs/Range"}, {"type": "null"}]},
        "wrapped": {"allOf": [{"$ref": "#/$defs/Range"}], "description": "pydantic v1 style"},
        "mode": {"$ref": "#/$defs/Mode"},
        "level": {"$ref": "#/$defs/Level"},
        "on": {"type": ["boolean", "null"]},
        "path": {"type": "string"},
        "note": {"type": ["string", "null"]},
        "either": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "fixed": {"const": 7},
        "bare": {"properties": {"a": {"type": "integer"}}},
        "list": {"items": {"type": "integer"}},
        "free": {"description": "no type at all"},
        "loop": {"$ref": "#"},
        "missing": {"$ref": "#/$defs/Nowhere"},
        "remote": {"$ref": "https://example.com/schema.json"},
    },
}
TYPES = tool_param_types(PYDANTIC)


@pytest.mark.parametrize(
    "param,types",
    [
        ("limit", ("integer", "null")),
        ("ratio", ("number", "null")),
        ("flags", ("array", "null")),
        ("lines", ("object",)),
        ("maybe_lines", ("object", "null")),
        ("wrapped", ("object",)),
        ("mode", ("string",)),
        ("level", ("integer",)),
        ("on", ("boolean", "null")),
        ("path", ("string",)),
        ("note", ("string", "null")),
        ("either", ("integer", "string")),
        ("fixed", ("integer",)),
        ("bare", ("object",)),
        ("list", ("array",)),
        ("free", ()),
        ("loop", ("object",)),
        ("missing", ()),
        ("remote", ()),
    ],
)
def test_the_types_each_schema_form_admits(param, types):
    assert TYPES[param] == types


@pytest.mark.parametrize(
    "param,text,value",
    [
        ("limit", "\n5\n", 5),
        ("limit", "null", None),
        ("limit", "five", "five"),  # not an integer: the text as written (the client's validation says so)
        ("ratio", "0.25", 0.25),
        ("ratio", "3", 3),  # an integer-valued number keeps its form
        ("ratio", "1e400", "1e400"),  # no finite number: text
        ("ratio", "1_000", "1_000"),  # Python's int() would take it; JSON does not
        ("flags", '["-v", "-x"]', ["-v", "-x"]),
        ("flags", '{"a": 1}', '{"a": 1}'),  # an object is no array
        ("lines", '\n{"start": 3, "end": 9}\n', {"start": 3, "end": 9}),
        ("maybe_lines", "null", None),
        ("wrapped", '{"start": 1}', {"start": 1}),
        ("mode", "fast", "fast"),
        ("level", "2", 2),
        ("on", "True", True),
        ("on", "null", None),
        ("path", "\nnull\n", "null"),  # a string is never converted
        ("path", "42", "42"),
        ("note", "null", "null"),  # text that may be null streams as text: it stays text
        ("either", "12", 12),
        ("either", "twelve", "twelve"),
        ("bare", '{"a": 1}', {"a": 1}),
        ("list", "[1, 2]", [1, 2]),
        ("free", "\n[1, 2]\n", "[1, 2]"),
        ("unknown", "7", "7"),
    ],
)
def test_values_are_typed_by_their_schema(param, text, value):
    got = typed_value(text, TYPES.get(param, ()))
    assert got == value and type(got) is type(value)


def test_text_parameters_stream_and_typed_ones_come_whole():
    assert is_text(TYPES["path"]) and is_text(TYPES["note"]) and is_text(TYPES["free"])
    assert not any(is_text(TYPES[p]) for p in ("limit", "lines", "on", "either", "level"))


def test_schemas_that_are_not_objects_give_no_types():
    assert tool_param_types(None) == {} and tool_param_types({"type": "object"}) == {}
    assert tool_param_types({"properties": {"x": "not a schema"}}) == {"x": ()}
    assert param_types({"anyOf": "not a list"}, {}) == ()
