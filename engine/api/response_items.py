"""The Responses API's output items (reasoning, message, function_call, custom_tool_call, tool_search_call)
and their streamed events."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

from engine.api.custom_tools import InputStream, custom_input
from engine.api.response_tools import SEARCH, ToolNames
from engine.parsers.call_stream import arguments_json
from engine.parsers.tool_calls import ToolCall


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(text: str, item_id: str | None = None, logprobs: list | None = None) -> dict[str, Any]:
    """logprobs: its tokens' entries (engine/api/response_logprobs.py), where the request included them."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {
        "type": "message",
        "id": item_id or _id("msg"),
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id or _id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def call_item(call: ToolCall, names: ToolNames = ToolNames()) -> dict[str, Any]:
    """A call's item: a custom_tool_call (its input the string) where `names.custom` names the tool, a
    tool_search_call for the client-run tool search (its arguments the object), else a function_call; a
    namespace's member named as its namespace has it (engine/api/response_tools.py). One the reply ended
    inside is incomplete, its arguments (or input) as far as written, as a stream sends it."""
    cut = call.partial is not None
    status = "incomplete" if cut else "completed"
    if names.search and call.name == SEARCH:
        return {
            "type": "tool_search_call",
            "id": _id("tsc"),
            "call_id": _id("call"),
            "arguments": call.arguments,
            "execution": "client",
            "status": status,
        }
    namespace, name = names.namespaces.get(call.name, (None, call.name))
    where = {"namespace": namespace} if namespace is not None else {}
    if call.name in names.custom:
        return {
            "type": "custom_tool_call",
            "id": _id("ctc"),
            "call_id": _id("call"),
            "name": name,
            **where,
            "input": InputStream().feed(call.partial) if cut else custom_input(call.arguments),
            "status": status,
        }
    return {
        "type": "function_call",
        "id": _id("fc"),
        "call_id": _id("call"),
        "name": name,
        **where,
        "arguments": call.partial if cut else arguments_json(call.arguments),
        "status": status,
    }


def output_items(
    reasoning: str,
    parts: list[str | ToolCall],
    names: ToolNames = ToolNames(),
    logprobs: list[list] | None = None,
) -> list[dict[str, Any]]:
    """A whole reply's items: its reasoning (if any), then a message for each text piece and its calls, in
    the order written (an empty message when there is neither). `logprobs`: each text piece's entries, in
    order (MessageLogprobs.groups)."""
    items = [reasoning_item(reasoning)] if reasoning else []
    groups = iter(logprobs or ())
    for part in parts or [""]:
        if isinstance(part, ToolCall):
            items.append(call_item(part, names))
        else:
            items.append(message_item(part, logprobs=next(groups, None)))
    return items


_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "tool_search_call": "tsc",
    "tool_search_output": "tso",
    "additional_tools": "at",
}
CALLS = ("function_call", "custom_tool_call")


def input_items(given: Any) -> list[dict[str, Any]]:
    """A request's `input` as the items input_items lists: a string becomes a user message; message
    content strings become input_text parts; every item gets an id (its own where it has one)."""
    raw = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    items = []
    for item in raw:
        item = {"type": "message", **item}
        if item["type"] == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        item.setdefault("id", _id(_ID_PREFIX.get(item["type"], "item")))
        if item["type"] == "message":
            item.setdefault("status", "completed")
        items.append(item)
    return items


class OutputEvents:
    """The server-sent events of one streamed response, as its reply's pieces arrive: each item added,
    its text deltas, done with its final form; `sequence_number`s in order. `output` holds the items done.
    Message tokens' logprobs given to add_logprobs go with the next text delta (and the message's part)."""

    def __init__(self, names: ToolNames = ToolNames()):
        self.names = names  # how calls become items (custom_tool_call, tool_search_call, namespaces)
        self.output: list[dict[str, Any]] = []
        self._logprobs: list[dict[str, Any]] = []  # entries not yet sent with a delta
        self.reasoning = ""  # all reasoning text so far (usage counts its tokens)
        self._current: dict[str, Any] | None = None  # the reasoning or message item being streamed
        self._call: dict[str, Any] | None = None  # the call item whose arguments (or input) are streaming
        self._input: InputStream | None = None  # a custom tool's: its input read out of the arguments
        self._sequence = itertools.count()

    def event(self, kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": next(self._sequence), **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def add_logprobs(self, entries: list[dict[str, Any]]) -> None:
        self._logprobs += entries

    def piece(self, kind: str, value: Any) -> list[str]:
        """Events for one piece of the reply parser: ("reasoning" | "text", str), ("tool_call", ToolCall),
        and a streamed call's ("tool_call_start", name), ("tool_call_args", str), ("tool_call_end", None)."""
        if kind == "tool_call_start":
            return self._close() + self._start_call(value)
        if kind == "tool_call_args":
            return self._call_args(value) if self._call else []
        if kind in ("tool_call", "tool_call_end"):
            if self._call is not None:
                return self._end_call(value)
            return self._close() + self._whole_call(value) if kind == "tool_call" else []
        want = "reasoning" if kind == "reasoning" else "message"
        events = [] if self._current and self._current["type"] == want else self._close() + self._open(want)
        self._current["text"] += value
        where = {"item_id": self._current["id"], "output_index": len(self.output), "content_index": 0}
        if want == "reasoning":
            self.reasoning += value
            return events + [self.event("response.reasoning_text.delta", **where, delta=value)]
        logprobs, self._logprobs = self._logprobs, []
        self._current["logprobs"] += logprobs
        return events + [self.event("response.output_text.delta", **where, delta=value, logprobs=logprobs)]

    def finish(self) -> list[str]:
        """The last item done (a reply with no words still gets its message)."""
        said = any(i["type"] in ("message", *CALLS) for i in self.output)
        if not said and not (self._current and self._current["type"] == "message"):
            return self._close() + self._open("message") + self._close()
        return self._close()

    def _open(self, kind: str) -> list[str]:
        index = len(self.output)
        if kind == "reasoning":
            self._current = {"type": "reasoning", "id": _id("rs"), "text": ""}
            added = {**reasoning_item("", self._current["id"]), "content": [], "status": "in_progress"}
            return [self.event("response.output_item.added", output_index=index, item=added)]
        self._current = {"type": "message", "id": _id("msg"), "text": "", "logprobs": []}
        added = {**message_item("", self._current["id"]), "status": "in_progress", "content": []}
        part = message_item("")["content"][0]
        return [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event(
                "response.content_part.added",
                item_id=self._current["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def _close(self) -> list[str]:
        if self._current is None:
            return []
        index, item_id, text = len(self.output), self._current["id"], self._current["text"]
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if self._current["type"] == "reasoning":
            item = reasoning_item(text, item_id)
            done = [self.event("response.reasoning_text.done", **where, text=text)]
        else:
            logprobs, self._logprobs = self._current["logprobs"] + self._logprobs, []
            item = message_item(text, item_id, logprobs)
            done = [
                self.event("response.output_text.done", **where, text=text, logprobs=logprobs),
                self.event("response.content_part.done", **where, part=item["content"][0]),
            ]
        self.output.append(item)
        self._current = None
        return [*done, self.event("response.output_item.done", output_index=index, item=item)]

    def _start_call(self, name: str) -> list[str]:
        """A streamed call's item added: a function_call, or a custom tool's custom_tool_call (its input
        then streams as the text it is, read out of the arguments' JSON)."""
        item = call_item(ToolCall(name, {}), self.names)
        if item["type"] == "tool_search_call":  # its arguments, an object, come whole when it is done
            self._call, self._input = {**item, "status": "in_progress"}, None
            return [self.event("response.output_item.added", output_index=len(self.output), item=self._call)]
        field = "input" if item["type"] == "custom_tool_call" else "arguments"
        self._call = {**item, field: "", "status": "in_progress"}
        self._input = InputStream() if field == "input" else None
        return [self.event("response.output_item.added", output_index=len(self.output), item=self._call)]

    def _call_args(self, text: str) -> list[str]:
        """A piece of the streamed call's arguments (a custom tool's: what it adds to the input)."""
        if self._call["type"] == "tool_search_call":
            return []
        if self._input is not None:
            text = self._input.feed(text)
        return self._delta(text) if text else []

    def _end_call(self, call: ToolCall | None) -> list[str]:
        """The streamed call done: completed with its arguments (a custom tool's input: the rest of it
        first), or (cut short) incomplete as streamed."""
        if self._call["type"] == "tool_search_call":
            done = {"arguments": call.arguments, "status": "completed"} if call is not None else {}
            item, self._call = {**self._call, "status": "incomplete", **done}, None
            self.output.append(item)
            return [self.event("response.output_item.done", output_index=len(self.output) - 1, item=item)]
        field, stream = self._stream_names()
        events: list[str] = []
        if call is not None:
            whole = call_item(call, self.names)[field]
            sent = self._call[field]
            if self._input is not None and whole.startswith(sent) and len(whole) > len(sent):
                events += self._delta(whole[len(sent) :])
            self._call = {**self._call, field: whole, "status": "completed"}
        else:
            self._call = {**self._call, "status": "incomplete"}
        item, self._call, self._input = self._call, None, None
        index = len(self.output)
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": index}
        done = (
            {"input": item["input"]}
            if field == "input"
            else {"name": item["name"], "arguments": item["arguments"]}
        )
        return events + [
            self.event(f"{stream}.done", **where, **done),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _delta(self, text: str) -> list[str]:
        field, stream = self._stream_names()
        self._call[field] += text
        where = {"item_id": self._call["id"], "output_index": len(self.output)}
        return [self.event(f"{stream}.delta", **where, delta=text)]

    def _stream_names(self) -> tuple[str, str]:
        """The streamed call's field and its events' prefix."""
        if self._call["type"] == "custom_tool_call":
            return "input", "response.custom_tool_call_input"
        return "arguments", "response.function_call_arguments"

    def _whole_call(self, call: ToolCall) -> list[str]:
        """A call that came whole (not streamed): added, its arguments (or input) in one delta, done."""
        events = self._start_call(call.name)
        if self._call["type"] == "tool_search_call":
            return events + self._end_call(call)
        field, _ = self._stream_names()
        return events + self._delta(call_item(call, self.names)[field]) + self._end_call(call)
