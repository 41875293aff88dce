"""The OpenAI Responses API: `POST /v1/responses` (streamed or not), `GET` / `DELETE /v1/responses/{id}`.

The input items become chat messages (the chat completions route's validation, images included): messages,
`function_call`s and `custom_tool_call`s (an assistant turn's tool calls) and their outputs (tool results);
a reasoning item's text is the next assistant turn's reasoning_content (the Qwen templates keep it for the
turns since the last user message, a tool loop, and drop it before). `instructions` is the system
turn. Function and custom tools (engine/api/custom_tools.py), which the client runs, in namespaces or not,
added by `additional_tools` items or found by a client-run tool search (engine/api/response_tools.py);
built-in ones (OpenAI runs them) are not offered to the model. The output: a `reasoning` item when the model thought, a `message`, and a `function_call` (or
`custom_tool_call`) per call. With `store` (the default) a response is kept in memory, the
latest 256 (engine/api/response_store.py), so `previous_response_id` continues its conversation and GET returns it.
A last `compaction_trigger` item, or `context_management`'s threshold, compacts the conversation first
(engine/api/response_compaction.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api import snapshot_hints
from engine.api.common import (
    KEEPALIVE_S,
    SSE_KEEPALIVE,
    complete,
    field,
    guarded,
    now,
    read_json,
    reasoning_tokens,
    sampling_params,
    start,
    stream_failure,
    until_failed,
    with_effort,
    written_unseen,
)
from engine.api.custom_tools import custom_arguments
from engine.api.errors import ApiError
from engine.api.images import preprocess_images
from engine.api.openai import template_messages
from engine.api.response_background import EventLog
from engine.api.response_compaction import (
    carries_all_before,
    compact_threshold,
    compaction_text,
    conversation_items,
    start_summary,
)
from engine.api.response_history import ITEMS as HOSTED_ITEMS
from engine.api.response_history import hosted_item_text
from engine.api.response_items import CALLS, OutputEvents, input_items, output_items
from engine.api.response_logprobs import MessageLogprobs, logprobs_setting
from engine.api.response_tools import (
    SEARCH,
    ResponseTools,
    ToolNames,
    function_spec,
    loaded_text,
    response_tools,
    seen_name,
)
from engine.api.response_truncation import fit_by_dropping_turns
from engine.api.state import ServerState
from engine.api.structured import responses_grammar
from engine.api.token_names import token_names
from engine.api.warn_once import warn_once
from engine.parsers.reply import ReplyParser
from engine.request import RequestOutput

router = APIRouter()
_TEXT_PARTS = ("input_text", "output_text", "text")


def _parts(content: Any, where: str) -> Any:
    """A Responses content array in chat completions' part shapes (text, image_url)."""
    if not isinstance(content, list):
        return content
    parts = []
    for i, part in enumerate(content):
        pw = f"{where}.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text")})
        elif kind == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise ApiError(
                    400, f"{pw} needs an 'image_url' (a data URL; file ids are not kept here)", "input"
                )
            parts.append(
                {"type": "image_url", "image_url": {"url": part["image_url"], "detail": part.get("detail")}}
            )
        elif kind == "input_file":
            keys = ("file_data", "filename", "file_id", "file_url")
            parts.append({"type": "file", "file": {k: part[k] for k in keys if k in part}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        else:
            raise ApiError(400, f"{pw} has type '{kind}'; this server takes text, images and files", "input")
    return parts


def _chat_messages(items: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The input items as chat completions messages (not yet validated: template_messages does that), and
    for each, the item it came from (`input[i]`, the first where calls were merged into one turn)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}], ["input"]
    if not isinstance(items, list):
        raise ApiError(400, "'input' must be a string or an array of items", "input")
    out: list[dict[str, Any]] = []
    origins: list[str] = []
    # the item before (reasoning aside) was a hosted tool's: an assistant message after it joins its turn
    after_hosted = False
    reasoning = ""  # reasoning items' text, for the assistant turn they came before
    first = _latest_whole_compaction(items) or 0  # the items before it are what it summarises
    for i, item in enumerate(items[first:], first):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in ("user", "system", "developer", "assistant"):
                raise ApiError(
                    400,
                    f"{where}.role is '{item.get('role')}'; use user, system, developer or assistant",
                    "input",
                )
            content = _parts(item.get("content"), where)
            if item.get("role") == "assistant" and after_hosted:  # one turn: the tools' work, then words
                _add_to_assistant_turn(out, origins, content, where)
            else:
                out.append({"role": item.get("role"), "content": content})
                origins.append(where)
        elif kind in CALLS:
            arguments = (
                item.get("arguments", "{}")
                if kind == "function_call"
                else custom_arguments(item.get("input"), f"{where}.input")
            )
            name = seen_name(item.get("namespace"), item.get("name"))  # (as the model saw the tool)
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            if out and out[-1].get("role") == "assistant":  # the turn's text, then its calls
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                origins.append(where)
        elif kind == "tool_search_call":  # the model's search for tools (the client ran it)
            arguments = item.get("arguments", {})
            call = {"id": item.get("call_id"), "type": "function", "function": {"name": SEARCH}}
            call["function"]["arguments"] = arguments if isinstance(arguments, str) else json.dumps(arguments)
            if out and out[-1].get("role") == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                origins.append(where)
        elif kind == "tool_search_output":  # the tools it found, written here (engine/api/response_tools.py)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": loaded_text(item.get("tools"), where),
                }
            )
            origins.append(where)
        elif kind == "additional_tools":
            pass  # its tools are the request's (engine/api/response_tools.py)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            if isinstance(output, list):
                output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
            if not isinstance(output, str):
                raise ApiError(400, f"{where}.output must be a string or an array of text parts", "input")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
            origins.append(where)
        elif kind in HOSTED_ITEMS:
            _add_to_assistant_turn(out, origins, hosted_item_text(item), where)
        elif kind == "compaction":  # what /v1/responses/compact left of the conversation before it
            out.append({"role": "user", "content": compaction_text(item)})
            origins.append(where)
        elif kind == "compaction_trigger":
            if i != len(items) - 1:
                raise ApiError(
                    400,
                    f"{where} is a compaction_trigger, which goes last in the input (what it compacts is "
                    "before it)",
                    "input",
                )
        elif kind != "reasoning" and isinstance(kind, str):  # a newer item type: passed over (logged once)
            _pass_over_item(where, kind)
            continue
        elif kind != "reasoning":
            raise ApiError(
                400,
                f"{where} has type '{kind}'; this server takes message, function_call, function_call_output, "
                "custom_tool_call, custom_tool_call_output, reasoning, compaction, additional_tools, tool_search_call, "
                "tool_search_output and hosted tools' history items "
                "(web_search_call, local_shell_call, mcp_call, ...)",
                "input",
            )
        if kind == "reasoning":
            reasoning += _reasoning_text(item, where)
        else:
            after_hosted = kind in HOSTED_ITEMS
            turn = out[-1] if out else None
            if reasoning and turn is not None and turn.get("role") == "assistant":
                # the template keeps it for the turns after the last user message (a tool loop)
                turn.setdefault("reasoning_content", reasoning)
            reasoning = ""
    return out, origins


def _pass_over_item(where: str, kind: str) -> None:
    """An input item of a type this server does not know (the Responses API gains new ones, and a client that
    keeps its history sends the item again every turn, so a 400 would fail the rest of the session): passed
    over, logged once a type."""
    warn_once(("response item", kind), "%s has type %r, unknown here: passed over", where, kind)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text as sent back (ours carry `content` reasoning_text parts; else its summary)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise ApiError(400, f"{where}.content must be an array of reasoning_text parts", "input")
    return "".join(p.get("text") for p in parts if isinstance(p.get("text"), str))


def _latest_whole_compaction(items: Any) -> int | None:
    """The index of the input's latest compaction item that stands for everything before it (None: none)."""
    if not isinstance(items, list):
        return None
    return max((i for i, item in enumerate(items) if carries_all_before(item)), default=None)


def ends_with_trigger(given: Any) -> bool:
    """Whether the input asks for in-band compaction: a `compaction_trigger` item last."""
    return (
        isinstance(given, list)
        and bool(given)
        and isinstance(given[-1], dict)
        and (given[-1].get("type") == "compaction_trigger")
    )


def _add_to_assistant_turn(out: list[dict[str, Any]], origins: list[str], content: Any, where: str) -> None:
    """Content (text or parts) in the assistant's turn: after its text so far (a turn not yet ending in
    calls), else a turn of its own."""
    last = out[-1] if out else None
    if last is None or last.get("role") != "assistant" or last.get("tool_calls"):
        out.append(
            {"role": "assistant", "content": content.lstrip("\n") if isinstance(content, str) else content}
        )
        origins.append(where)
    elif isinstance(last.get("content"), str) and isinstance(content, str):
        last["content"] = last["content"].rstrip("\n") + "\n" + content
    else:
        last["content"] = _as_parts(last.get("content")) + _as_parts(content)


def _as_parts(content: Any) -> list[dict[str, Any]]:
    return content if isinstance(content, list) else [{"type": "text", "text": content}] if content else []


def _named_as_input(e: ApiError, origins: list[str]) -> ApiError:
    """The chat route's error about messages[k], named as the Responses request has it."""
    m = re.match(r"messages\[(\d+)\]", e.message)
    if m is None or int(m.group(1)) >= len(origins):
        return e
    return ApiError(e.status, origins[int(m.group(1))] + e.message[m.end() :], "input")


def _tools(body: dict, declared: ResponseTools) -> list[dict[str, Any]] | None:
    """Every tool the reply may call, as function specs (engine/api/response_tools.py flattened them)."""
    if not declared.flat or body.get("tool_choice") == "none":
        return None
    return [function_spec(tool, where) for tool, where in zip(declared.flat, declared.wheres)]


def _template_kwargs(body: dict) -> dict[str, Any]:
    effort = (field(body, "reasoning", dict) or {}).get("effort")
    return with_effort(dict(field(body, "chat_template_kwargs", dict, {})), effort, "reasoning.effort")


def response_usage(state: ServerState, out: RequestOutput, in_reasoning: bool) -> dict[str, Any]:
    prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
    thought = reasoning_tokens(state.engine.tokenizer, out, in_reasoning)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": out.num_cached_tokens},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(thought, completion)},
        "total_tokens": prompt + completion,
    }


def _history_turn(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The output as the assistant's chat message (for a later previous_response_id)."""
    text = "".join(c["text"] for item in output if item["type"] == "message" for c in item["content"])
    calls = [
        {
            "id": i["call_id"],
            "type": "function",
            "function": {
                "name": seen_name(i.get("namespace"), i["name"]),
                "arguments": i["arguments"] if "arguments" in i else custom_arguments(i["input"], "input"),
            },
        }
        if i["type"] in CALLS
        else {
            "id": i["call_id"],
            "type": "function",
            "function": {"name": SEARCH, "arguments": json.dumps(i["arguments"])},
        }
        for i in output
        if i["type"] in (*CALLS, "tool_search_call")
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": text or None}
    reasoning = "".join(_reasoning_text(item, "output") for item in output if item["type"] == "reasoning")
    if reasoning:  # the template keeps it for the turns after the last user message (a tool loop)
        turn["reasoning_content"] = reasoning
    if calls:
        turn["tool_calls"] = calls
    return turn


@dataclass(frozen=True)
class ResponsesPrompt:
    """A Responses request's prompt, rendered: the conversation it continues and adds to, and its tokens."""

    previous: str | None
    turns: list[dict[str, Any]]  # the chat messages: the previous response's conversation, then the input's
    given: Any  # the input, item references resolved
    instructions: str | None
    truncation: str
    tools: list[dict[str, Any]] | None  # every tool the reply may call
    listed: list[dict[str, Any]] | None  # those the prompt's tool list holds (deferred ones apart)
    flat: list[dict[str, Any]]  # the tools as flat function / custom entries (engine/api/response_tools.py)
    names: ToolNames  # how calls become output items
    images: Any  # MessageImages, in prompt order
    text: str
    ids: list[int]


def responses_prompt(state: ServerState, body: dict) -> ResponsesPrompt:
    """The prompt a create (or an input_tokens count) renders from the request: instructions, the previous
    response's conversation, the input items, the tools; the earliest exchanges dropped with truncation auto."""
    for name, what in (("conversation", "conversations"), ("prompt", "prompt templates")):
        if body.get(name) is not None:
            raise ApiError(
                400,
                f"'{name}': this server keeps no {what}; send the items as 'input' (and the instructions as "
                "'instructions'), or chain responses with previous_response_id",
                name,
            )
    truncation = field(body, "truncation", str, "disabled")
    if truncation not in ("auto", "disabled"):
        raise ApiError(400, f"'truncation' must be auto or disabled (got {truncation!r})", "truncation")
    previous = field(body, "previous_response_id", str)
    if previous and state.background.running(previous):
        raise ApiError(
            400,
            f"previous_response_id '{previous}' is still running in the background; wait until GET "
            f"/v1/responses/{previous} says it is completed",
            "previous_response_id",
        )
    history = list(state.responses.get(previous)[1]) if previous else []
    if body.get("input") is None:
        raise ApiError(400, "'input' is required", "input")
    given = state.responses.resolve_references(body["input"])
    if _latest_whole_compaction(given) is not None:
        history = []  # a compaction item of this server's stands for the previous conversation too
    new_turns, origins = _chat_messages(given)
    turns = history + new_turns
    instructions = field(body, "instructions", str)
    system = [{"role": "system", "content": instructions}] if instructions else []
    origins = (
        ["instructions"] * len(system) + ["previous_response_id's conversation"] * len(history) + origins
    )
    field(body, "tools", list)
    declared = response_tools(body, given)
    tools = _tools(body, declared)
    listed = [t for t in tools if t["function"]["name"] not in declared.deferred] or None if tools else None
    kwargs = _template_kwargs(body)

    def render(cut: int):  # the prompt without the first `cut` turns: (its images, text, token ids)
        try:
            messages, images = template_messages(system + turns[cut:], state.reads_images)
        except ApiError as e:
            raise _named_as_input(e, origins[: len(system)] + origins[len(system) + cut :]) from e
        return (images, *state.render(messages, listed, kwargs))

    images, prompt_text, ids = render(0)
    if truncation == "auto":
        reserve = field(body, "max_output_tokens", int) or 1
        limit = state.max_context - reserve
        images, prompt_text, ids = fit_by_dropping_turns(turns, (images, prompt_text, ids), render, limit)
    return ResponsesPrompt(
        previous,
        turns,
        given,
        instructions,
        truncation,
        tools,
        listed,
        declared.flat,
        declared.names,
        images,
        prompt_text,
        ids,
    )


@router.post("/v1/responses/input_tokens")
async def input_tokens(request: Request):
    """The tokens a create with this body would give the model (OpenAI's responses.input_tokens.count)."""
    state: ServerState = request.app.state.ninfer
    p = await asyncio.to_thread(responses_prompt, state, await read_json(request))
    tokens = len(state.with_images(p.ids, await preprocess_images(state, p.images)))
    return {"object": "response.input_tokens", "input_tokens": tokens}


@router.post("/v1/responses")
async def create(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    background, streamed = field(body, "background", bool, False), field(body, "stream", bool, False)
    store = field(body, "store", bool, True)
    if background and not store:
        raise ApiError(
            400,
            "a background response is stored to be polled (GET /v1/responses/{id}); leave 'store' true",
            "store",
        )
    p = await asyncio.to_thread(responses_prompt, state, body)  # (off the event loop: state.render)
    previous, given, instructions, truncation = p.previous, p.given, p.instructions, p.truncation
    tools, names = p.tools, p.names
    reply_tokens = field(body, "max_output_tokens", int) or state.default_max_tokens()
    trigger, threshold = (
        ends_with_trigger(given),
        compact_threshold(body, max(1, state.max_context - reply_tokens)),
    )
    grammar = responses_grammar({**body, "tools": p.flat}, tools, state.engine.tokenizer)
    top_logprobs = logprobs_setting(body)
    params = sampling_params(
        state,
        body,
        "max_output_tokens",
        state.default_max_tokens(),
        None,
        grammar=grammar,
        logprobs=top_logprobs,
    )
    images = await preprocess_images(state, p.images)
    summary = None  # a compaction asked for: its summary is written first (engine/api/response_compaction.py)
    if trigger or (threshold is not None and len(state.with_images(p.ids, images)) >= threshold):
        conversation = given[:-1] if trigger else conversation_items(given)
        summary = await start_summary(state, body, conversation, the_reply=trigger)
    rid, created = f"resp_{uuid.uuid4().hex[:24]}", now()
    max_calls = None if field(body, "parallel_tool_calls", bool, True) else 1
    run = _Run(p, None)

    async def launch(prompt: ResponsesPrompt, prompt_images) -> None:
        """Start the reply to `prompt` (the request's, or the compacted conversation's)."""
        run.prompt, run.in_reasoning = prompt, prompt.text.rstrip().endswith("<think>")
        kwargs = _template_kwargs(body)  # where the tool list ends (engine/api/snapshot_hints.py)
        hints = await snapshot_hints.after_tools(state, prompt.listed, kwargs, prompt.text, prompt.ids)
        run.stream = await start(state, prompt.ids, params, prompt_images, snapshot_hints=hints)
        if top_logprobs is not None:
            eos = state.engine.llm.eos_token_ids
            names = token_names(state, body)
            run.logprobs = MessageLogprobs(names, params, eos, run.in_reasoning, tools, max_calls)

    async def compacted() -> None:
        """The compaction done: the reply is written from its item, the instructions and the tools."""
        await launch(run.prompt, await preprocess_images(state, run.prompt.images))

    if summary is None:
        await launch(p, images)

    def response(status: str, output: list[dict[str, Any]], usage: dict | None, out=None) -> dict[str, Any]:
        incomplete = out is not None and out.finish_reason == "length"
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "background": background,
            "status": "incomplete" if incomplete else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": instructions,
            "max_output_tokens": body.get("max_output_tokens"),
            "model": state.reply_model(params),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "previous_response_id": previous,
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "store": store,
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_logprobs": body.get("top_logprobs"),
            "top_p": body.get("top_p", 1.0),
            "truncation": truncation,
            "usage": usage,
            "metadata": body.get("metadata") or {},
            "user": body.get("user"),
        }

    def finish(out: RequestOutput | None, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The completed response: the reply's `out` (None: a trigger's, the compaction alone)."""
        usage = None if out is None else response_usage(state, out, run.in_reasoning)
        if run.summary_out is not None:  # the compaction's tokens count too
            usage = _added(response_usage(state, run.summary_out, summary.in_reasoning), usage)
        final = response("completed", output, usage, out)
        if store:
            turns = run.prompt.turns + ([] if out is None else [_history_turn(output)])
            state.responses.put(final, turns, input_items(given))
        return final

    def compaction_item(out: RequestOutput) -> dict[str, Any]:
        """The compaction's item, from its summary; the conversation from here on is the item alone."""
        run.summary_out = out
        item = summary.whole_item(state, out)
        run.prompt = responses_prompt(state, {**body, "previous_response_id": None, "input": [item]})
        return item

    async def reply(waiting: Request | None, seen=None) -> dict[str, Any]:  # the whole (stored) response
        output = []
        if summary is not None:
            out = (await complete(state, summary.stream, waiting, summary.in_reasoning, None, None, seen))[0]
            output.append(compaction_item(out))
            if trigger:
                return finish(None, output)
            await compacted()
        out, reasoning, parts = await complete(
            state, run.stream, waiting, run.in_reasoning, tools, max_calls, seen
        )
        if run.logprobs:
            run.logprobs.feed(out)
        logprobs = run.logprobs.groups if run.logprobs else None
        return finish(out, output + output_items(reasoning, parts, names, logprobs))

    if background and not streamed:  # answered at once; stored when done (engine/api/response_background.py)

        async def run_in_background(began) -> None:
            await reply(None, lambda out: out.token_ids and began())

        queued = response("queued", [], None)
        state.background.start(queued, p.turns, input_items(given), run_in_background)
        return JSONResponse(queued)
    if not streamed:
        return JSONResponse(await reply(request))

    stream = OutputEvents(names)
    failed_with: list[str] = []  # the engine's sentence (or a bug's, in the background), when it failed

    def failed(message: str) -> str:
        failed_response = response("failed", stream.output, None)
        failed_response["error"] = {"code": "server_error", "message": message}
        failed_with.append(message)
        return stream.event("response.failed", response=failed_response)

    def failure(out: RequestOutput) -> str | None:
        message = stream_failure(state, out)
        return failed(message) if message is not None else None

    async def compaction_events(began):
        """A compaction's item added, `compacting` as its summary is sampled, done; then the reply's start
        (a failure's event instead, and nothing after it)."""
        added = {"type": "compaction", "id": summary.item_id}
        yield stream.event("response.output_item.added", output_index=0, item=added)

        def sampled(out: RequestOutput, delta: str) -> list[str]:
            if began is not None and out.token_ids:
                began()
            if not delta:
                return []
            # more of the summary sampled (the event carries none of it)
            return [stream.event("response.compaction.compacting", item_id=summary.item_id, output_index=0)]

        out = None
        async for event in written_unseen(state, summary.stream, failure, SSE_KEEPALIVE, sampled):
            if isinstance(event, str):
                yield event
            else:
                out = event
        if out is None:
            return
        item = compaction_item(out)
        stream.output.append(item)
        yield stream.event("response.output_item.done", output_index=0, item=item)
        if not trigger:
            try:
                await compacted()
            except ApiError as e:  # the compacted prompt refused (the summary alone past the context)
                yield failed(e.message)

    async def events(began=None):
        """The stream's events; `began()` (background) is called once the first token is out."""
        created = response("queued" if background else "in_progress", [], None)
        yield stream.event("response.created", response=created)
        if background:
            yield stream.event("response.queued", response=created)
        yield stream.event("response.in_progress", response=response("in_progress", [], None))
        if summary is not None:
            async for event in compaction_events(began):
                yield event
            if failed_with or run.summary_out is None:
                return
            if trigger:
                final = finish(None, stream.output)
                yield stream.event(f"response.{final['status']}", response=final)
                return
        parser = ReplyParser(run.in_reasoning, tools, max_calls, stream_calls=True)
        out = None
        async for item in until_failed(run.stream, failure):
            if isinstance(item, str):
                yield item
                return
            if item is None:  # nothing yet (a long prompt prefilling): keep the connection alive
                yield SSE_KEEPALIVE
                continue
            out, delta = item
            if began is not None and out.token_ids:
                began()
            state.metrics.token(out)
            if run.logprobs:
                stream.add_logprobs(run.logprobs.feed(out))
            for kind, piece in parser.feed(delta, final=out.finished):
                for e in stream.piece(kind, piece):
                    yield e
        for e in stream.finish():
            yield e
        state.metrics.finished(out)
        final = finish(out, stream.output)
        yield stream.event(f"response.{final['status']}", response=final)

    def error_event(message: str) -> str:
        return stream.event("error", code="server_error", message=message, param=None)

    if not background:
        return StreamingResponse(guarded(events(), error_event), media_type="text/event-stream")

    written = EventLog()  # the task writes the events; this request (and GETs with stream=true) follow them

    def bug_event(message: str) -> str:  # a bug while streaming: stored as failed too
        failed_with.append(message)
        return error_event(message)

    async def write(began) -> None:
        async for event in guarded(events(began), bug_event):
            if event is not SSE_KEEPALIVE:
                written.add(event)
        if failed_with:
            raise ApiError(500, failed_with[0])  # stored as failed

    state.background.start(response("queued", [], None), p.turns, input_items(given), write, written)
    return StreamingResponse(following(written, -1), media_type="text/event-stream")


@dataclass
class _Run:
    """What a create's reply runs on, set when it starts: after the compaction where one was asked for."""

    prompt: ResponsesPrompt
    stream: Any  # the reply's AsyncStream
    in_reasoning: bool = False
    logprobs: MessageLogprobs | None = None
    summary_out: RequestOutput | None = None  # the compaction's summary, when one was written


def _added(a: dict[str, Any], b: dict[str, Any] | None) -> dict[str, Any]:
    """Two passes' usage as one (a compaction's and the reply's)."""
    if b is None:
        return a
    return {
        "input_tokens": a["input_tokens"] + b["input_tokens"],
        "input_tokens_details": {
            "cached_tokens": a["input_tokens_details"]["cached_tokens"]
            + b["input_tokens_details"]["cached_tokens"]
        },
        "output_tokens": a["output_tokens"] + b["output_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": a["output_tokens_details"]["reasoning_tokens"]
            + b["output_tokens_details"]["reasoning_tokens"]
        },
        "total_tokens": a["total_tokens"] + b["total_tokens"],
    }


async def following(events: EventLog, after: int) -> AsyncIterator[str]:
    """A background response's stream, from the event after sequence number `after`; a client that leaves
    stops following, not the response."""
    async for event in events.follow(after, KEEPALIVE_S):
        yield SSE_KEEPALIVE if event is None else event


@router.get("/v1/responses/{response_id}")
async def retrieve(request: Request, response_id: str):
    """The stored response; with `stream=true`, a background streamed one's events after sequence number
    `starting_after` (default: all of them), then the new ones until it ends."""
    state: ServerState = request.app.state.ninfer
    query = request.query_params
    if query.get("stream", "false").lower() not in ("true", "1"):
        return JSONResponse(state.responses.get(response_id)[0])
    given = query.get("starting_after", "-1")
    try:
        after = int(given)
    except ValueError:
        after = -2
    if after < -1:
        raise ApiError(
            400, f"'starting_after' must be a sequence number, 0 or more (got {given!r})", "starting_after"
        )
    return StreamingResponse(
        following(state.background.events(response_id, after), after), media_type="text/event-stream"
    )


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(request: Request, response_id: str):
    """The input items a stored response was given: `order` desc (the default) or asc, `limit` 1..100
    (20), `after` an item id."""
    items = request.app.state.ninfer.responses.get(response_id)[2]
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"'order' is {order!r}; use asc or desc", "order")
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ApiError(
            400, f"'limit' must be a whole number from 1 to 100 (got {query.get('limit')!r})", "limit"
        )
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ApiError(400, f"'after' is {after!r}, which is not an input item of {response_id}", "after")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }


@router.post("/v1/responses/{response_id}/cancel")
async def cancel(request: Request, response_id: str):
    """Stop a background response; it is stored as cancelled (one already finished is answered as it is)."""
    return JSONResponse(await request.app.state.ninfer.background.cancel(response_id))


@router.delete("/v1/responses/{response_id}")
async def delete(request: Request, response_id: str):
    state = request.app.state.ninfer
    if state.background.running(response_id):  # its engine request is aborted first
        await state.background.cancel(response_id)
    state.responses.delete(response_id)
    state.background.forget(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
