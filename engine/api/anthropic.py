"""Anthropic-native routes: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api import anthropic_compaction, anthropic_diagnostics, context_editing, snapshot_hints
from engine.api.anthropic_history import BLOCKS as SERVER_BLOCKS
from engine.api.anthropic_history import server_block_text
from engine.api.anthropic_prewarm import prewarm
from engine.api.anthropic_sse import event, failure_event
from engine.api.anthropic_sse import usage as _usage
from engine.api.anthropic_tool_changes import CHANGES, change_text, inline_definitions
from engine.api.anthropic_tools import AnthropicTools, anthropic_tools
from engine.api.common import (
    complete,
    field,
    guarded,
    read_json,
    sampling_params,
    start,
    until_failed,
    written_unseen,
)
from engine.api.context_editing import PARAM
from engine.api.documents import file_parts
from engine.api.errors import ApiError
from engine.api.images import MessageImages, anthropic_image, preprocess_images, template_content
from engine.api.response_compaction import kept_user_budget
from engine.api.state import ServerState
from engine.api.structured import anthropic_grammar
from engine.api.warn_once import warn_once
from engine.parsers.call_stream import arguments_json
from engine.parsers.reply import ReplyParser
from engine.parsers.tool_calls import ToolCall
from engine.request import RequestOutput

router = APIRouter()


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or an array of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ApiError(400, f"{where}.content[{i}] must be an object with a 'type'")
    return content


# the content block types read here (in the messages that may hold them)
_KNOWN_BLOCKS = frozenset(
    ("text", "image", "document", "search_result", "tool_use", "tool_result", "thinking", "redacted_thinking")
    + ("compaction", "fallback", "mcp_tool_listing", *SERVER_BLOCKS, *CHANGES)
)


def _unknown_block(block: dict, where: str) -> list[str]:
    """A block of a type this server does not know (Anthropic's API gains new ones, and a client keeps a
    block in a session's history for good, so a 400 would lock the session): its `text` if it has one,
    else nothing; logged once per type."""
    warn_once(
        ("anthropic block", block["type"]),
        "%s has type %r, unknown here: its text is read, the rest passed over",
        where,
        block["type"],
    )
    return [block["text"]] if isinstance(block.get("text"), str) else []


def _document_parts(block: dict, where: str, images: MessageImages) -> list[str | dict[str, str]]:
    """A `document` block (source type text, content of text blocks, or a base64 PDF: its pages' text, a
    scanned page's images where the server takes images) as the parts the model reads: its title and
    context, then the document; URLs and file ids are refused (nothing is fetched or stored here)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text" and isinstance(source.get("data"), str):
        body = [source["data"]]
    elif kind == "content" and isinstance(source.get("content"), (str, list)):
        parts = source["content"]
        parts = [{"type": "text", "text": parts}] if isinstance(parts, str) else parts
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts
        ):
            raise ApiError(
                400, f"{where}.source.content must hold text blocks (this model reads no images there)"
            )
        body = ["\n".join(p["text"] for p in parts)]
    elif kind == "base64" and isinstance(source.get("data"), str):
        body = file_parts(source["data"], where, source.get("media_type"), images)
    elif kind in ("url", "file"):
        raise ApiError(
            400,
            f"{where} is a document by {'URL' if kind == 'url' else 'file id'}; this server fetches and keeps "
            "no files: send it inline (source type base64, or its text)",
        )
    else:
        raise ApiError(
            400, f'{where}.source must be a text, content or base64 source ({{"type": "text", "data": ...}})'
        )
    head = [
        f"{key.capitalize()}: {block[key]}" for key in ("title", "context") if isinstance(block.get(key), str)
    ]
    return [*(f"{line}\n" for line in head), *body, "\n\n"]


def _search_result_text(block: dict, where: str) -> str:
    """A `search_result` block (a search's hit given to the model, in a user message or a tool result) as
    the text the model reads: its title and source, then its text blocks. (Citations are not written.)"""
    content = block.get("content")
    if not isinstance(block.get("title"), str) or not isinstance(block.get("source"), str):
        raise ApiError(400, f"{where} (a search_result) needs a string 'title' and a string 'source'")
    if not isinstance(content, list) or not all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        raise ApiError(400, f"{where}.content (a search_result's) must be an array of text blocks")
    body = "\n".join(p["text"] for p in content)
    return f"Search result: {block['title']}\nSource: {block['source']}\n{body}\n\n"


def _tool_result_content(
    block: dict, where: str, images: MessageImages, declared: AnthropicTools
) -> str | list[dict[str, str]]:
    content = block.get("content", "")
    if isinstance(content, str):
        parts: list[str | dict[str, str]] = [content]
    elif isinstance(content, list):
        parts = []
        for i, b in enumerate(content):
            bw = f"{where}.content[{i}]"
            if isinstance(b, dict) and b.get("type") == "image":
                parts.append(images.add(anthropic_image(b, bw), bw))
            elif isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
                parts.append(b["text"])
            elif isinstance(b, dict) and b.get("type") == "document":
                parts.extend(_document_parts(b, bw, images))
            elif isinstance(b, dict) and b.get("type") == "search_result":
                parts.append(_search_result_text(b, bw))
            elif isinstance(b, dict) and b.get("type") == "tool_reference":
                parts.append(declared.loaded(b.get("tool_name"), bw))
            else:
                raise ApiError(
                    400,
                    f"{bw} of a tool_result must be a text, image, document, search_result or tool_reference "
                    "block",
                )
    else:
        raise ApiError(400, f"{where}.content must be a string or an array of text and image blocks")
    if block.get("is_error"):
        parts.insert(0, "Error: ")
    return template_content(parts)


def template_messages(
    body: dict, declared: AnthropicTools, read_scans: bool = False
) -> tuple[list[dict[str, Any]], MessageImages]:
    """The messages as the chat template takes them (a tool_reference read as the definition of the tool
    it loads), and their images in prompt order."""
    out: list[dict[str, Any]] = []
    images = MessageImages(read_scans)
    if body.get("system") is not None and (text := _system_text(body["system"], "system")):
        out.append({"role": "system", "content": text})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array")
    # the latest compaction block stands for everything before it (engine/api/anthropic_compaction.py)
    first, first_block = anthropic_compaction.latest(messages) or (0, 0)
    for i, m in enumerate(messages[first:], first):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise ApiError(400, f"{where}.role must be 'user', 'assistant' or 'system'")
        if m["role"] == "system":  # a mid-conversation system message (Claude Code's harness context)
            if text := _system_text(m.get("content"), f"{where}.content"):
                out.append({"role": "system", "content": text})
            continue
        texts: list[str | dict[str, str]] = []
        calls = []
        thoughts: list[str] = []  # an assistant turn's thinking: the template's reasoning for the turn
        only_compaction = False  # the message held a compaction block and nothing else of its own
        blocks = _blocks(m.get("content"), where)
        skip = first_block if i == first else 0
        for j, block in enumerate(blocks[skip:], skip):
            kind, bw = block["type"], f"{where}.content[{j}]"
            if kind == "compaction":
                if block.get("content") is not None:  # (null: a failed compaction, passed over)
                    out.append({"role": "user", "content": anthropic_compaction.block_text(block, bw)})
                only_compaction = not texts and not calls
                continue
            only_compaction = False
            if kind == "text":
                if not isinstance(block.get("text"), str):
                    raise ApiError(400, f"{bw}.text must be a string")
                texts.append(block["text"])
            elif kind == "image" and m["role"] == "user":
                texts.append(images.add(anthropic_image(block, bw), bw))
            elif kind == "document" and m["role"] == "user":
                texts.extend(_document_parts(block, bw, images))
            elif kind == "search_result" and m["role"] == "user":
                texts.append(_search_result_text(block, bw))
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise ApiError(400, f"{bw} needs a string 'name' and an object 'input'")
                calls.append(
                    {
                        "type": "function",
                        "id": block.get("id"),
                        "function": {"name": block["name"], "arguments": block.get("input", {})},
                    }
                )
            elif kind == "tool_result" and m["role"] == "user":
                if texts:
                    out.append({"role": "user", "content": template_content(texts)})
                    texts = []
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id"),
                        "content": _tool_result_content(block, bw, images, declared),
                    }
                )
            elif kind in SERVER_BLOCKS and m["role"] == "assistant":
                texts.append(server_block_text(block, bw))  # what Anthropic's servers ran in that turn
            elif kind == "thinking" and m["role"] == "assistant":
                if not isinstance(block.get("thinking"), str):
                    raise ApiError(400, f"{bw}.thinking must be a string")
                thoughts.append(block["thinking"])
            elif kind in ("redacted_thinking", "fallback", "mcp_tool_listing") and m["role"] == "assistant":
                continue  # Anthropic's servers' own: encrypted, a fallback's boundary, an MCP listing
            elif kind in CHANGES:  # a tool offered or withdrawn from here on
                texts.append(change_text(block, bw, declared.loaded))
            elif kind in _KNOWN_BLOCKS:
                article = "an" if m["role"] == "assistant" else "a"
                raise ApiError(
                    400, f"{bw} has type '{kind}', which {article} {m['role']} message cannot hold"
                )
            else:  # a block type newer than this server: its text read, the rest passed over
                texts.extend(_unknown_block(block, bw))
        if only_compaction:
            continue
        if texts or calls or not any(o.get("role") == "tool" for o in out[-1:]):
            msg: dict[str, Any] = {"role": m["role"], "content": template_content(texts)}
            if calls:
                msg["tool_calls"] = calls
            if "".join(thoughts):  # kept by the template for the turns since the last user message
                msg["reasoning_content"] = "\n\n".join(t for t in thoughts if t)
            out.append(msg)
    return out, images


def _system_text(value: Any, where: str) -> str:
    """A system prompt's text: the top-level `system`, or a system message's content (Anthropic's
    mid-conversation system messages), a string or text blocks (joined by a blank line)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in value):
        return "\n\n".join(str(b.get("text", "")) for b in value)
    raise ApiError(400, f"'{where}' must be a string or an array of text blocks")


def _tools(body: dict) -> tuple[AnthropicTools, bool]:
    """The declared tools, and whether the reply may call them (not with tool_choice none)."""
    if field(body, "mcp_servers", list):
        raise ApiError(
            400,
            "'mcp_servers': this server connects to no MCP servers; connect them in your client and declare "
            "their tools in 'tools'",
        )
    declared = anthropic_tools(field(body, "tools", list) or [], inline_definitions(body.get("messages")))
    choice = field(body, "tool_choice", dict)
    if choice is not None and choice.get("type") not in ("auto", "any", "tool", "none"):
        raise ApiError(400, "'tool_choice.type' must be auto, any, tool or none")
    return declared, bool(declared.specs) and (choice or {}).get("type") != "none"


ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")


def _template_kwargs(body: dict) -> dict[str, Any]:
    """What the chat template hears: thinking on or off (`thinking`), and `output_config.effort` as the
    template's reasoning_effort (it does not turn thinking on or off by itself, as on Anthropic's API)."""
    kwargs: dict[str, Any] = {}
    effort = (field(body, "output_config", dict) or {}).get("effort")
    if effort is not None:
        if effort not in ANTHROPIC_EFFORTS:
            raise ApiError(
                400, f"'output_config.effort' must be {', '.join(ANTHROPIC_EFFORTS)}", "output_config"
            )
        kwargs["reasoning_effort"] = effort
    thinking = field(body, "thinking", dict)
    if thinking is None:
        return kwargs
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "between_tools", "disabled"):
        raise ApiError(400, "'thinking.type' must be 'enabled', 'adaptive', 'between_tools' or 'disabled'")
    if thinking.get("display") not in (None, "summarized", "omitted", "updates"):
        raise ApiError(400, "'thinking.display' must be 'summarized', 'omitted' or 'updates'")
    # adaptive: the model decides how long to think (Qwen's thinking on, no budget); between_tools: the
    # Qwen templates think at every assistant turn, so on (a turn after a tool result is such a turn);
    # display (summarized, omitted, or the beta's updates: only the notes between tool calls): the thinking
    # is sent either way (a signature cannot carry it back hidden; a client sends it back as it came)
    return {**kwargs, "enable_thinking": kind != "disabled"}


def _budget(body: dict) -> int | None:
    """thinking.budget_tokens: the most reasoning tokens before the answer (enforced: then </think>)."""
    thinking = field(body, "thinking", dict)
    budget = (thinking or {}).get("budget_tokens") if (thinking or {}).get("type") == "enabled" else None
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise ApiError(400, f"'thinking.budget_tokens' must be a positive integer (got {budget!r})")
    return budget


def _stop_sequences(body: dict) -> list[str] | None:
    stops = field(body, "stop_sequences", list)
    if stops is not None and not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "'stop_sequences' must be an array of strings")
    return stops


def _stop_reason(out: RequestOutput, called: bool = False) -> str:
    if called:
        return "tool_use"
    if out.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if out.stop_string is not None else "end_turn"


async def _prepare(state: ServerState, body: dict):
    """(the rendered prompt, its token ids, the tools the reply may call, the images preprocessed, the
    context edits applied and the input tokens before them: engine/api/context_editing.py)."""
    declared, callable_ = _tools(body)
    snapshot_hints.find(body)  # each cache_control checked (engine/api/snapshot_hints.py)
    edits = context_editing.parse(body)
    listed = declared.listed() if callable_ else None
    kwargs = _template_kwargs(body)

    def render(b: dict):  # (text, ids, images); an image counts as its placeholder token in len(ids)
        messages, images = template_messages(b, declared, state.reads_images)
        # a last assistant turn is a prefill: the reply continues it (as Anthropic's API does), unless it
        # ends in a compaction block (a paused turn sent back to go on)
        last_role = b["messages"][-1].get("role")
        prefill = last_role == "assistant" and not anthropic_compaction.ends_with_block(b["messages"])
        return (*state.render(messages, listed, kwargs, continue_final=prefill), images)

    # (off the event loop: a long conversation renders and encodes for ~0.5 s, the other streams go on)
    (text, ids, images), applied, original = await asyncio.to_thread(
        context_editing.apply, body, edits, render
    )
    tools = declared.specs if callable_ else None
    return text, ids, tools, await preprocess_images(state, images), applied, original


async def _snapshot_hints(state: ServerState, body: dict, text: str, ids: list[int]) -> tuple[int, ...]:
    """Where the rendered prompt's tool list and `cache_control` prefixes end, in its tokens
    (engine/api/snapshot_hints.py): for an engine that snapshots a recurrent state; none for the others,
    which reuse any page anyway."""
    if not state.engine.snapshots_enabled:
        return ()
    declared, callable_ = _tools(body)
    listed, kwargs = declared.listed() if callable_ else None, _template_kwargs(body)

    def render(cut: dict) -> str:  # a cut request as the prompt renders it (its tools among the listed ones)
        names = {t.get("name") for t in cut.get("tools") or () if isinstance(t, dict)}
        tools = [s for s in listed or () if s["function"]["name"] in names] or None
        return state.render_text(template_messages(cut, declared, state.reads_images)[0], tools, kwargs)

    points = snapshot_hints.find(body)
    return await snapshot_hints.of_marks(state, body, points, render, listed, kwargs, text, ids)


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{uuid.uuid4().hex[:24]}",
        "name": call.name,
        "input": call.arguments,
    }


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    _, ids, _, images, applied, original = await _prepare(state, body)
    tokens = len(state.with_images(ids, images))
    if PARAM not in body:
        return {"input_tokens": tokens}
    # the tokens before the edits, images widened as in the edited prompt
    return {"input_tokens": tokens, PARAM: {"original_input_tokens": original + tokens - len(ids)}}


@router.post("/v1/messages")
async def messages(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    field(body, "model", str, required=True)
    max_tokens = field(body, "max_tokens", int, required=True)
    if max_tokens < 0:
        raise ApiError(400, f"max_tokens must be at least 0 (got {max_tokens}; 0 pre-warms the prompt cache)")
    if max_tokens == 0:  # the prompt computed into the cache, no reply (engine/api/anthropic_prewarm.py)
        return await prewarm(state, body, request, _prepare, _snapshot_hints)
    compaction = anthropic_compaction.requested(body)
    opted, previous = anthropic_diagnostics.requested(body)
    prompt_text, ids, tools, images, applied, _ = await _prepare(state, body)
    seen = await asyncio.to_thread(anthropic_diagnostics.fingerprint, body, ids) if opted else None
    edited = {PARAM: {"applied_edits": applied}} if PARAM in body else {}
    grammar = anthropic_grammar(body, tools, state.engine.tokenizer)
    params = sampling_params(
        state,
        body,
        "max_tokens",
        max_tokens,
        _stop_sequences(body),
        grammar=grammar,
        thinking_budget=_budget(body),
    )
    stream = field(body, "stream", bool, False)
    # tool_choice's disable_parallel_tool_use: at most one tool_use block
    max_calls = (
        1 if (field(body, "tool_choice", dict) or {}).get("disable_parallel_tool_use") is True else None
    )
    run = _Run()
    summary = None  # a compaction due: its summary is written first (engine/api/anthropic_compaction.py)
    resumed = anthropic_compaction.ends_with_block(body["messages"])  # a paused turn back: just compacted
    fits = max(1, state.max_context - max_tokens)  # a prompt this long would be refused

    async def launch(text: str, prompt_ids: list[int], prompt_images) -> None:
        """Start the reply to a rendered prompt (the request's, or the compacted conversation's)."""
        run.in_reasoning = text.rstrip().endswith("<think>")
        # the request's cache_control prefixes (a compacted conversation's prompt is another one)
        hints = await _snapshot_hints(state, body, text, prompt_ids) if prompt_ids is ids else ()
        run.stream = await start(state, prompt_ids, params, prompt_images, snapshot_hints=hints)

    if compaction is not None and compaction.due(len(state.with_images(ids, images)), resumed, fits):
        summary = await anthropic_compaction.start_summary(state, body, compaction, _prepare)
    else:
        await launch(prompt_text, ids, images)
    only_block = summary is not None and (compaction.trigger is None or compaction.pause)
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    diagnosed = {}  # (engine/api/anthropic_diagnostics.py)
    if seen is not None:
        diagnosed = {"diagnostics": state.cache_diagnostics.diagnose(previous, seen)}
        state.cache_diagnostics.remember(mid, seen)

    def compacted(out: RequestOutput) -> dict[str, Any]:
        """The compaction's block, from its summary (content null: the model wrote none, a failed
        compaction)."""
        run.summary_out = out
        tokenizer = state.text_tokenizer()
        user = anthropic_compaction.latest_user_texts(
            body["messages"], lambda t: len(tokenizer.encode(t, False)), kept_user_budget(state.max_context)
        )
        return anthropic_compaction.block(summary.text(out) or None, user)

    async def go_on(block: dict[str, Any]) -> None:
        """The reply to the compacted conversation: the system prompt and tools, then the block (a failed
        compaction's: the conversation as it was)."""
        if block["content"] is None:
            await launch(prompt_text, ids, images)
            return
        text, compact_ids, _, compact_images, _, _ = await _prepare(
            state, {**body, "messages": [{"role": "assistant", "content": [block]}]}
        )
        await launch(text, compact_ids, compact_images)

    def usage(out: RequestOutput | None) -> dict[str, Any]:
        """The reply's usage; with a compaction, its pass in `iterations` (the parameter's, the only pass, in the
        top-level counts too; an edit's, as Anthropic's API counts it, not)."""
        if run.summary_out is None:
            return _usage(out)
        passes = [{"type": "compaction", **_usage(run.summary_out)}]
        if out is not None:
            passes.append({"type": "message", **_usage(out)})
        top = _usage(out if out is not None else run.summary_out)
        if out is None and compaction.trigger is not None:  # paused after an edit's compaction
            top = {k: 0 for k in top}
        return {**top, "iterations": passes}

    def message(content: list[dict[str, Any]], stop_reason: str, out: RequestOutput | None) -> dict[str, Any]:
        return {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": state.reply_model(params),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": out.stop_string if out is not None else None,
            "usage": usage(out),
            **edited,
            **diagnosed,
        }

    if not stream:
        content = []
        if summary is not None:
            out = (await complete(state, summary.stream, request, summary.in_reasoning, None))[0]
            content.append(compacted(out))
            if only_block:
                return JSONResponse(message(content, "compaction", None))
            await go_on(content[0])
        out, reasoning, parts = await complete(state, run.stream, request, run.in_reasoning, tools, max_calls)
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        # text and calls in the order written, as streamed (a call the reply ended inside: its whole members)
        content += [{"type": "text", "text": p} if isinstance(p, str) else _tool_use(p) for p in parts]
        if not reasoning and not parts:  # neither thinking nor an answer: an empty text block, as streamed
            content.append({"type": "text", "text": ""})
        finished_calls = any(isinstance(p, ToolCall) and p.partial is None for p in parts)
        return JSONResponse(message(content, _stop_reason(out, finished_calls), out))

    def failure(out: RequestOutput) -> str | None:
        return failure_event(state, out)

    async def compaction_events():
        """The compaction block, its one delta (the whole summary) once written; then the reply's start. An
        error event instead, and the stream ends."""
        yield event(
            "content_block_start", {"index": 0, "content_block": {"type": "compaction", "content": None}}
        )
        out = None
        async for item in written_unseen(state, summary.stream, failure, event("ping", {})):
            if isinstance(item, str):
                yield item
            else:
                out = item
        if out is None:
            return
        block = compacted(out)
        delta = {"type": "compaction_delta", **{k: block[k] for k in ("content", "encrypted_content")}}
        yield event("content_block_delta", {"index": 0, "delta": delta})
        yield event("content_block_stop", {"index": 0})
        if not only_block:
            try:
                await go_on(block)
            except ApiError as e:  # the compacted prompt refused
                yield event("error", {"error": {"type": "invalid_request_error", "message": e.message}})

    async def events():
        called = streaming = False
        block = {"index": -1, "type": None}

        def switch(kind: str):
            if block["type"] == kind:
                return
            if block["type"] is not None:
                yield event("content_block_stop", {"index": block["index"]})
            block["index"] += 1
            block["type"] = kind
            empty = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            yield event("content_block_start", {"index": block["index"], "content_block": empty})

        start_usage = {
            "input_tokens": len(ids),
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        yield event(
            "message_start",
            {
                "message": {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": state.reply_model(params),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                    **diagnosed,
                }
            },
        )
        yield event("ping", {})
        if summary is not None:
            async for e in compaction_events():
                yield e
                if e.startswith("event: error"):
                    return
            if run.summary_out is None:
                return
            if only_block:
                delta = {"stop_reason": "compaction", "stop_sequence": None}
                yield event("message_delta", {"delta": delta, "usage": usage(None), **edited})
                yield event("message_stop", {})
                return
            block["index"] = 0  # the reply's blocks follow the compaction's
        parser = ReplyParser(run.in_reasoning, tools, max_calls, stream_calls=True)
        out = None
        async for item in until_failed(run.stream, failure):
            if isinstance(item, str):
                yield item
                return
            if item is None:  # nothing yet (a long prompt prefilling): Anthropic's keep-alive
                yield event("ping", {})
                continue
            out, delta = item
            state.metrics.token(out)
            for kind, piece in parser.feed(delta, final=out.finished):
                if kind == "reasoning":
                    for e in switch("thinking"):
                        yield e
                    delta_block = {"type": "thinking_delta", "thinking": piece}
                    yield event("content_block_delta", {"index": block["index"], "delta": delta_block})
                elif kind in ("tool_call_start", "tool_call"):
                    # a call opens its tool_use block as its name is read (its input then streams), or
                    # whole when it came unstreamed
                    called = called or kind == "tool_call"
                    if kind == "tool_call" and streaming:
                        streaming = False  # its input is all sent: the block closes with the next one
                        continue
                    if block["type"] is not None:
                        yield event("content_block_stop", {"index": block["index"]})
                    use = _tool_use(piece) if kind == "tool_call" else _tool_use(ToolCall(piece, {}))
                    block["index"] += 1
                    block["type"] = "tool_use"
                    start_block = {**use, "input": {}}
                    yield event(
                        "content_block_start", {"index": block["index"], "content_block": start_block}
                    )
                    if kind == "tool_call":
                        partial = {
                            "type": "input_json_delta",
                            "partial_json": arguments_json(use["input"]),
                        }
                        yield event("content_block_delta", {"index": block["index"], "delta": partial})
                    streaming = kind == "tool_call_start"
                elif kind == "tool_call_args":
                    partial = {"type": "input_json_delta", "partial_json": piece}
                    yield event("content_block_delta", {"index": block["index"], "delta": partial})
                elif kind == "tool_call_end":  # cut short: the block closes as it is
                    streaming = False
                else:
                    for e in switch("text"):
                        yield e
                    yield event(
                        "content_block_delta",
                        {"index": block["index"], "delta": {"type": "text_delta", "text": piece}},
                    )
        if block["type"] is None:
            for e in switch("text"):
                yield e
        yield event("content_block_stop", {"index": block["index"]})
        state.metrics.finished(out)
        yield event(
            "message_delta",
            {
                "delta": {"stop_reason": _stop_reason(out, called), "stop_sequence": out.stop_string},
                "usage": usage(out),
                **edited,
            },
        )
        yield event("message_stop", {})

    def error_event(message: str) -> str:
        return event("error", {"error": {"type": "api_error", "message": message}})

    return StreamingResponse(guarded(events(), error_event), media_type="text/event-stream")


@dataclass
class _Run:
    """What a request's reply runs on, set when it starts: after the compaction where one is due."""

    stream: Any = None  # the reply's AsyncStream
    in_reasoning: bool = False
    summary_out: RequestOutput | None = None  # the compaction's summary, when one was written
