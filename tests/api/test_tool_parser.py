"""The streaming tool-call parser on awkward splits of both Qwen forms."""

from __future__ import annotations

import pytest

from engine.parsers.tool_calls import ToolCall, ToolCallParser, parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "extra": {"type": "object"},
                    "ratio": {"type": "number"},
                },
            },
        },
    }
]

JSON_REPLY = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "note": "a </tool_call> inside", "nested": {"a": [1, {"b": "}"}]}}}\n</tool_call>'
XML_REPLY = (
    "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan </parameter-ish> Francisco\n</parameter>\n"
    '<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=extra>\n{"wind": true}\n</parameter>\n'
    "<parameter=ratio>\n0.5\n</parameter>\n</function>\n</tool_call>"
)
JSON_CALL = ToolCall(
    "get_weather", {"city": "Paris", "note": "a </tool_call> inside", "nested": {"a": [1, {"b": "}"}]}}
)
XML_CALL = ToolCall(
    "get_weather",
    {
        "city": "San </parameter-ish> Francisco",
        "days": 3,
        "metric": True,
        "extra": {"wind": True},
        "ratio": 0.5,
    },
)


def feed_in_pieces(text: str, size: int) -> list:
    parser = ToolCallParser(TOOLS)
    events = []
    for i in range(0, len(text), size):
        events += parser.feed(text[i : i + size])
    return events + parser.feed("", final=True)


def collapse(events: list) -> tuple[str, list[ToolCall]]:
    return "".join(e for e in events if isinstance(e, str)), [e for e in events if isinstance(e, ToolCall)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
@pytest.mark.parametrize(
    "reply,call,prefix", [(JSON_REPLY, JSON_CALL, "Let me check.\n"), (XML_REPLY, XML_CALL, "Checking.\n")]
)
def test_any_split_gives_the_same_call_and_no_tag_leaks(size, reply, call, prefix):
    text, calls = collapse(feed_in_pieces(reply, size))
    assert calls == [call]
    assert text == prefix and "<" not in text


def test_two_calls_and_text_between():
    reply = JSON_REPLY + "\nthen\n" + XML_REPLY
    text, calls = parse_tool_calls(reply, TOOLS)
    assert calls == [JSON_CALL, XML_CALL]
    assert text == "Let me check.\n\nthen\nChecking.\n"


def test_plain_text_with_angle_brackets_passes_through():
    text, calls = parse_tool_calls("a < b and <tool> is not <tool_call", TOOLS)
    assert calls == [] and text == "a < b and <tool> is not <tool_call"


def test_malformed_call_is_given_back_as_text():
    reply = "x <tool_call>{not json}</tool_call> y"
    text, calls = parse_tool_calls(reply, TOOLS)
    assert calls == [] and text == reply


def test_unfinished_call_is_given_back_at_the_end():
    text, calls = parse_tool_calls('<tool_call>{"name": "get_weather", "argu', TOOLS)
    assert calls == [] and text == '<tool_call>{"name": "get_weather", "argu'


def test_string_arguments_are_decoded():
    text, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', None)
    assert calls == [ToolCall("f", {"a": 1})]


def test_untyped_xml_values_stay_strings():
    reply = "<tool_call><function=other><parameter=n>\n42\n</parameter></function></tool_call>"
    assert parse_tool_calls(reply, TOOLS)[1] == [ToolCall("other", {"n": "42"})]


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_whitespace_between_and_after_calls_is_no_text(piece):
    """Qwen writes parallel calls one per line: the newlines are not content; text after a call is. The
    start of a tag that ends the reply after a call is a call cut short (max_tokens): no text, as a cut call
    gives none."""
    reply = "\n".join([JSON_REPLY[len("Let me check.\n") :]] * 2) + "\n"
    cases = ((reply, ""), (reply + "\nDone.", "\n\nDone."), (reply + "<tool", ""), (reply + "a <", "\na <"))
    for text, want in cases:
        parser, events = ToolCallParser(TOOLS), []
        for i in range(0, len(text), piece):
            events += parser.feed(text[i : i + piece])
        events += parser.feed("", final=True)
        assert [e for e in events if isinstance(e, ToolCall)] == [JSON_CALL, JSON_CALL]
        assert "".join(e for e in events if isinstance(e, str)) == want


BODY_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "set_mode",
            "parameters": {
                "type": "object",
                "properties": {
                    "body": {"type": "object"},
                    "note": {"type": "string"},
                    "level": {"type": "integer"},
                },
            },
        },
    }
]


@pytest.mark.parametrize(
    "written,arguments",
    [
        # the last value's </parameter> left out before </function> (reported at temperature 0)
        (
            '<parameter=body>\n{"mode": "AIR_CLEAN", "on": true}\n</function>',
            {"body": {"mode": "AIR_CLEAN", "on": True}},
        ),
        # one left out before the next parameter, one before the end
        (
            "<parameter=note>\nfirst line\nsecond line\n<parameter=level>\n3\n</function>",
            {"note": "first line\nsecond line", "level": 3},
        ),
        # the values hold the tags, not on lines of their own: they are text
        (
            "<parameter=note>\nA call ends with </tool_call> on its own; a value with </parameter> here."
            " A <parameter=level> tag and </function> mid-line.\n</parameter>\n</function>",
            {
                "note": "A call ends with </tool_call> on its own; a value with </parameter> here."
                " A <parameter=level> tag and </function> mid-line."
            },
        ),
        # a line that starts with a tag no parameter of the tool has stays in the value
        (
            "<parameter=note>\nsee\n<parameter=other>\n</parameter>\n</function>",
            {"note": "see\n<parameter=other>"},
        ),
        # </function> left out
        ("<parameter=level>\n4\n</parameter>\n", {"level": 4}),
    ],
)
@pytest.mark.parametrize("size", [1, 4, 1000])
def test_values_end_where_the_model_meant_them_to(written, arguments, size):
    reply = f"<tool_call>\n<function=set_mode>\n{written}\n</tool_call>"
    parser = ToolCallParser(BODY_TOOL)
    events = []
    for i in range(0, len(reply), size):
        events += parser.feed(reply[i : i + size])
    text, calls = collapse(events + parser.feed("", final=True))
    assert calls == [ToolCall("set_mode", arguments)] and text == ""


BARE = "<function=set_mode>\n<parameter=level>\n2\n</parameter>\n<parameter=note>\nfast\n</parameter>\n</function>"


@pytest.mark.parametrize(
    "reply,text,calls",
    [
        # Qwen3.5 / 3.6 now and then leave the <tool_call> wrapper out (often keeping its close)
        ("I'll set it.\n" + BARE, "I'll set it.\n", 1),
        ("I'll set it.\n" + BARE + "\n</tool_call>", "I'll set it.\n", 1),
        (BARE + "\n" + BARE.replace("2", "3"), "", 2),
        ("Now:\n" + BARE + "\n<tool_call>\n" + BARE + "\n</tool_call>", "Now:\n", 2),
        ("<tool_call>\n" + BARE + "\n</tool_call>\n" + BARE, "", 2),  # (the whitespace between is no text)
        # prose about calls stays prose: in a code fence, not at a line's start, an undeclared tool, text after
        ("Like this:\n```\n" + BARE + "\n```", "Like this:\n```\n" + BARE + "\n```", 0),
        ("Write " + BARE, "Write " + BARE, 0),
        (
            "x\n" + BARE.replace("set_mode", "get_weather_x"),
            "x\n" + BARE.replace("set_mode", "get_weather_x"),
            0,
        ),
        ("x\n" + BARE + "\nThat is the form.", "x\n" + BARE + "\nThat is the form.", 0),
        ("x\n<function=set_mode>\n<parameter=level>\n2", "x\n<function=set_mode>\n<parameter=level>\n2", 0),
    ],
)
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_call_written_without_its_wrapper_is_a_call_where_a_call_would_be(reply, text, calls, size):
    parser = ToolCallParser(BODY_TOOL)
    events = []
    for i in range(0, len(reply), size):
        events += parser.feed(reply[i : i + size])
    got_text, got_calls = collapse(events + parser.feed("", final=True))
    assert got_text == text and len(got_calls) == calls
    assert all(
        c == ToolCall("set_mode", {"level": int(c.arguments["level"]), "note": "fast"}) for c in got_calls
    )
