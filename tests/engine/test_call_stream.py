"""Tool calls streamed as the model writes them (engine/parsers/call_stream.py through ToolCallParser and
ReplyParser): the name first, then the arguments' JSON in pieces that add up to the finished call's
arguments_json; the finished calls and the text exactly what the whole reply parses to."""

from __future__ import annotations

import json
import random

import pytest

from engine.parsers.call_stream import arguments_json, partial_arguments
from engine.parsers.reply import ReplyParser, parse_reply, reply_parts
from engine.parsers.tool_calls import CLOSE, OPEN

SCHEMA = {
    "n": {"type": "integer"},
    "x": {"type": "number"},
    "b": {"type": "boolean"},
    "o": {"type": "object"},
    "a": {"type": "array"},
    "s": {"type": "string"},
    "on": {"anyOf": [{"type": "integer"}, {"type": "null"}]},  # Pydantic's Optional[int]
    "r": {"$ref": "#/$defs/R"},
}
DEFS = {"R": {"type": "object", "properties": {"a": {"type": "integer"}}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"properties": SCHEMA, "$defs": DEFS}}}]
# what strings may hold: quotes, backslashes, control characters, non-ASCII, astral characters, tags
ALPHABET = [
    "a",
    " ",
    '"',
    "\\",
    "\n",
    "\t",
    "\x01",
    "é",
    "😀",
    "\u2028",
    "<",
    "/",
    ">",
    "{",
    "}",
    "</tool_call>",
    "</parameter>",
]


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 10)))


def _value(rng: random.Random, depth: int = 0):
    kinds = [
        lambda: _string(rng),
        lambda: rng.randint(-(10**12), 10**12),
        lambda: rng.uniform(-1e4, 1e4),
        lambda: rng.choice([True, False, None, 1.5e300, -0.0]),
        lambda: {f"{_string(rng)[:4]}{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 3))},
        lambda: [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))],
    ]
    return rng.choice(kinds if depth < 3 else kinds[:4])()


def _json_call(rng: random.Random) -> str:
    """A Qwen3 JSON call as a model may write it: any spacing, escaped or raw non-ASCII."""
    args = {f"k{i}{_string(rng)[:3]}": _value(rng) for i in range(rng.randint(0, 4))}
    spacing = rng.choice([{}, {"indent": 2}, {"separators": (",", ":")}, {"separators": (" , ", " : ")}])
    text = json.dumps(args, ensure_ascii=rng.random() < 0.5, **spacing)
    return f'\n{{"name": "f", "arguments": {text}}}\n'


def _xml_call(rng: random.Random) -> str:
    """A Qwen3.5 XML call: typed and string parameters, values with and without their newlines."""
    values = {
        "n": lambda: str(rng.randint(-99, 99)),
        "x": lambda: str(rng.uniform(-5, 5)),
        "b": lambda: rng.choice(["true", "False", "maybe"]),
        "o": lambda: rng.choice([json.dumps({"é": [1, None]}), "{broken"]),
        "a": lambda: rng.choice(["[1, 2]", "not json"]),
        "s": lambda: _string(rng).replace("</tool_call>", ""),
        "on": lambda: rng.choice(["5", "null", "x"]),
        "r": lambda: rng.choice(['{"a": 1}', "[1]"]),
        "free": lambda: _string(rng).replace("</tool_call>", ""),
    }
    # now and then a value's </parameter> left out: the next tag, on a line of its own, ends it
    params = "".join(
        f"<parameter={key}>{rng.choice(['', chr(10)])}{values[key]()}"
        + rng.choice(["</parameter>\n", "\n</parameter>\n", "\n"])
        for key in rng.sample(sorted(values), rng.randint(0, 4))
    )
    return f"\n<function=f>\n{params}</function>\n"


def _streamed(text: str, rng: random.Random, **kwargs) -> list[tuple[str, object]]:
    parser = ReplyParser(False, TOOLS, stream_calls=True, **kwargs)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 8)
        pieces += parser.feed(text[i : i + n], final=i + n >= len(text))
        i += n
    return pieces


@pytest.mark.parametrize("form", ["json", "xml"])
def test_streamed_pieces_add_up_to_the_finished_calls(form):
    """Random calls (two a reply, text around them) in random pieces: each call starts with its name,
    its argument pieces join into arguments_json of the call the whole reply parses to, and the text and
    the calls are the whole reply's."""
    rng = random.Random(7 if form == "json" else 8)
    make = _json_call if form == "json" else _xml_call
    streamed_calls = 0
    for _ in range(400):
        calls = [make(rng) for _ in range(2)]
        text = f"Let me look.{OPEN}{calls[0]}{CLOSE}\n{OPEN}{calls[1]}{CLOSE}"
        _, content, want = parse_reply(text, False, TOOLS)
        pieces = _streamed(text, rng)
        got, args, names = [], [], []
        for kind, value in pieces:
            if kind == "tool_call_start":
                names.append(value)
                args.append("")
            elif kind == "tool_call_args":
                args[-1] += value
            elif kind == "tool_call":
                got.append(value)
        assert "".join(v for k, v in pieces if k == "text") == content
        assert got == want and len(got) == 2
        assert names == ["f", "f"]  # every call of these forms streams
        assert args == [arguments_json(c.arguments) for c in got]
        streamed_calls += sum(len(a) > 2 for a in args)
    assert streamed_calls > 300  # (most calls have arguments to stream)


def test_a_long_string_argument_streams_as_it_is_written():
    """The XML form's string value, and the JSON form's, go out while the call is still being written."""
    long = "line\n" * 200
    for body in (
        f"<function=f>\n<parameter=s>\n{long}</parameter>\n</function>\n",
        f'{{"name": "f", "arguments": {{"s": {json.dumps(long)}}}}}\n',
    ):
        parser = ReplyParser(False, TOOLS, stream_calls=True)
        text = OPEN + body + CLOSE
        half = parser.feed(text[: len(text) // 2])
        assert half[0] == ("tool_call_start", "f")
        sent = "".join(v for k, v in half if k == "tool_call_args")
        assert len(sent) > 400 and arguments_json({"s": long}).startswith(sent)


def test_other_layouts_come_whole_and_cut_calls_end():
    """Keys in another order, or arguments as a string: no pieces, the call whole at its end. A call cut
    short (the reply ends inside it) ends with tool_call_end, its text not given back."""
    rng = random.Random(3)
    for body in (
        '{"arguments": {"s": "x"}, "name": "f"}',
        '{"name": "f", "arguments": "{\\"s\\": \\"x\\"}"}',
    ):
        pieces = _streamed(f"{OPEN}\n{body}\n{CLOSE}", rng)
        assert [k for k, _ in pieces] == ["tool_call"] and pieces[0][1].arguments == {"s": "x"}
    pieces = _streamed(f'Hi.{OPEN}\n{{"name": "f", "arguments": {{"s": "unfinish', rng)
    assert [k for k, _ in pieces if k != "tool_call_args"] == ["text", "tool_call_start", "tool_call_end"]
    assert "".join(v for k, v in pieces if k == "tool_call_args") == '{"s": "unfinish'
    pieces = _streamed(f"{OPEN}\n<function=f>\n<parameter=s>\nabc", rng)
    assert [k for k, _ in pieces][-1] == "tool_call_end"
    # without streaming the cut call is given back as text, as before
    assert parse_reply(f"{OPEN}\n<function=f>\n<parameter=s>\nabc", False, TOOLS)[1].startswith(OPEN)


@pytest.mark.parametrize(
    "written, whole",
    [
        ('{"city": "Paris", "days": ', {"city": "Paris"}),
        ('{"city": "Par', {}),
        ("{", {}),
        ("", {}),
        ('{"a": {"b": 1, "c": "x', {"a": {"b": 1}}),
        ('{"a": [1, 2', {"a": [1]}),  # 2 may go on (20)
        ('{"a": [1, 2, "x"', {"a": [1, 2, "x"]}),
        (
            '{"s": "say \\"hi\\"", "t": true, "n": null, "x": -1.5e3}',
            {"s": 'say "hi"', "t": True, "n": None, "x": -1500.0},
        ),
        ('{"k": "}]"', {"k": "}]"}),
    ],
)
def test_partial_arguments_keep_the_whole_members(written, whole):
    assert partial_arguments(written) == whole


def test_a_reply_cut_inside_a_call_parses_as_the_stream_sent_it():
    """cut_calls: the call the reply ended inside, as streamed (arguments so far), not text given back; the
    parts in the order written."""
    rng = random.Random(5)
    for text in (
        f'Hi.{OPEN}\n{{"name": "f", "arguments": {{"s": "abc", "n": 4',
        f"Hi.{OPEN}\n<function=f>\n<parameter=s>\nabc\n</parameter>\n<parameter=n>\n4",
    ):
        sent = "".join(v for k, v in _streamed(text, rng) if k == "tool_call_args")
        reasoning, parts = reply_parts(text, False, TOOLS, cut_calls=True)
        assert reasoning == "" and parts[0] == "Hi." and len(parts) == 2
        assert (parts[1].name, parts[1].partial, parts[1].arguments) == ("f", sent, {"s": "abc"})
        assert parse_reply(text, False, TOOLS)[1] == text  # without cut_calls: given back as text
    whole = f'{OPEN}\n{{"name": "f", "arguments": {{"n": 1}}}}\n{CLOSE}'
    parts = reply_parts(f"Calling.{whole}\nThen more.{whole}", False, TOOLS, cut_calls=True)[1]
    assert [p if isinstance(p, str) else p.arguments for p in parts] == [
        "Calling.",
        {"n": 1},
        "\nThen more.",
        {"n": 1},
    ]
    assert all(p.partial is None for p in parts if not isinstance(p, str))


def test_calls_past_max_calls_stream_nothing():
    text = "".join(f'{OPEN}\n{{"name": "f", "arguments": {{"n": {i}}}}}\n{CLOSE}' for i in range(3))
    pieces = _streamed(text, random.Random(1), max_calls=1)
    assert [k for k, _ in pieces if k != "tool_call_args"] == ["tool_call_start", "tool_call"]
    assert [v.arguments for k, v in pieces if k == "tool_call"] == [{"n": 0}]


READ = [
    {
        "type": "function",
        "function": {"name": "read", "parameters": {"properties": {"path": {"type": "string"}}}},
    }
]
JSON_CALL = '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
XML_CALL = "<tool_call>\n<function=read>\n<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize("call", [JSON_CALL, XML_CALL])
@pytest.mark.parametrize("size", [1, 7, 1000])
def test_a_call_written_in_a_reasoning_that_never_closes_is_made(call, size):
    """Qwen3.5 / 3.6 now and then call a tool before `</think>` and end the turn there: the call is made
    (after the reasoning it was written in), streamed or whole, at most max_calls of them."""
    reply = f"I should read the file first.\n{call}\n{call}"
    reasoning, text, calls = parse_reply(reply, True, READ)
    assert reasoning == reply and text == "" and [c.arguments for c in calls] == [{"path": "a.py"}] * 2
    parser = ReplyParser(True, READ, max_calls=1, stream_calls=True)
    pieces = [p for i in range(0, len(reply), size) for p in parser.feed(reply[i : i + size])]
    pieces += parser.feed("", final=True)
    made = [p for p in pieces if p[0] != "reasoning"]
    assert made == [("tool_call", calls[0])]
    assert "".join(p for k, p in pieces if k == "reasoning") == reply


def test_a_call_only_named_in_a_reasoning_that_closes_stays_reasoning():
    reply = f"Maybe {JSON_CALL} would do.\n</think>\n\nNo call needed."
    reasoning, text, calls = parse_reply(reply, True, READ)
    assert JSON_CALL in reasoning and text == "No call needed." and calls == []
    assert parse_reply(f"Thinking {JSON_CALL}", True, None)[2] == []  # (no tools declared: none made)
