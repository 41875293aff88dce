"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.api import snapshot_hints
from engine.api.choices import merged, num_choices, start_choices
from engine.api.common import (
    SSE_KEEPALIVE,
    collect_choices,
    field,
    guarded,
    not_a_function_tool,
    now,
    read_json,
    reasoning_tokens,
    sampling_params,
    stream_failure,
    top_alternatives,
    truncated_prompt,
    with_effort,
    with_keepalive,
)
from engine.api.custom_tools import custom_arguments, custom_function, custom_input, custom_names
from engine.api.documents import openai_file_parts
from engine.api.errors import ApiError
from engine.api.images import MessageImages, openai_image, preprocess_images, template_content
from engine.api.model_capabilities import anthropic_capabilities
from engine.api.prompt_logprobs import prompt_logprobs_field, vllm_prompt_logprobs
from engine.api.state import ServerState
from engine.api.stream_usage import stream_usage
from engine.api.structured import openai_grammar
from engine.api.timings import Clock, with_progress
from engine.api.token_ids import TokenIds
from engine.api.token_ids import asked as token_ids_asked
from engine.api.token_names import TokenNames, token_names
from engine.parsers.call_stream import arguments_json, partial_arguments
from engine.parsers.reply import ReplyParser, parse_reply
from engine.parsers.tool_calls import ToolCall
from engine.request import RequestOutput

router = APIRouter()
log = logging.getLogger("ninfer.api")
ROLES = {"system", "developer", "user", "assistant", "tool"}


def _content(content: Any, where: str, images: MessageImages) -> str | list[dict[str, str]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str | dict[str, str]] = []
        for i, part in enumerate(content):
            pw = f"{where}.content[{i}]"
            if not isinstance(part, dict) or "type" not in part:
                raise ApiError(400, f"{pw} must be an object with a 'type'")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise ApiError(400, f"{pw}.text must be a string")
                parts.append(part["text"])
            elif part["type"] == "image_url":
                data, max_pixels = openai_image(part, pw)
                parts.append(images.add(data, pw, max_pixels))
            elif part["type"] == "file":
                parts.extend(openai_file_parts(part.get("file"), pw, images))
            elif part["type"] == "input_audio":
                raise ApiError(400, f"{pw} is input_audio; this model takes text, images and files only")
            else:
                raise ApiError(400, f"{pw} has unknown type '{part['type']}'")
        return template_content(parts)
    raise ApiError(400, f"{where}.content must be a string or an array of content parts")


def template_messages(messages: Any, read_scans: bool = False) -> tuple[list[dict[str, Any]], MessageImages]:
    """The messages as the chat template takes them, and their images in prompt order."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array", "messages")
    out = []
    images = MessageImages(read_scans)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object", "messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise ApiError(
                400, f"{where}.role is '{role}'; use one of {', '.join(sorted(ROLES))}", "messages"
            )
        msg: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _content(m.get("content"), where, images),
        }
        if role == "assistant":
            reasoning = _reasoning(m, where)
            if reasoning:  # the template keeps it for the turns after the last user message (a tool loop)
                msg["reasoning_content"] = reasoning
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise ApiError(400, f"{where}.tool_calls must be an array", "messages")
            msg["tool_calls"] = [
                _tool_call_for_template(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)
            ]
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        out.append(msg)
    return out, images


def _reasoning(message: dict[str, Any], where: str) -> str | None:
    """An assistant message's reasoning as a client sends it back: `reasoning_content` (vLLM's and
    DeepSeek's field, what replies here carry) or `reasoning` (newer vLLM's, OpenRouter's)."""
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ApiError(400, f"{where}.{name} must be a string", "messages")
        return value
    return None


def _tool_call_for_template(call: Any, where: str) -> dict[str, Any]:
    if isinstance(call, dict) and call.get("type") == "custom":
        custom = call.get("custom")
        if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
            raise ApiError(400, f"{where}.custom.name must be a string", "messages")
        arguments = custom_arguments(custom.get("input"), f"{where}.custom.input")
        return {
            "type": "function",
            "id": call.get("id"),
            "function": {"name": custom["name"], "arguments": arguments},
        }
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ApiError(400, f"{where}.function.name must be a string", "messages")
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError as e:
        # a call a reply ended inside (max_tokens), sent back as it came: its members that are whole
        cut_short = e.msg.startswith("Unterminated string") or e.pos >= len(args.rstrip())
        if not (cut_short and args.lstrip().startswith("{")):
            raise ApiError(400, f"{where}.function.arguments is not valid JSON ({e.msg})", "messages") from e
        parsed = partial_arguments(args.lstrip())
    return {"type": "function", "id": call.get("id"), "function": {"name": fn["name"], "arguments": parsed}}


def stop_list(body: dict) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        return stop
    raise ApiError(400, "'stop' must be a string or an array of at most 16 strings", "stop")


def _logprobs_settings(body: dict) -> int | None:
    if not field(body, "logprobs", bool, False):
        return None
    return field(body, "top_logprobs", int, 0)


def usage_json(
    out: RequestOutput,
    *others: RequestOutput,
    n: int = 1,
    reasoning: int | None = None,
    prediction: bool = False,
) -> dict[str, Any]:
    """Usage of one output, or of several choices, n a prompt (each prompt and its cache hit counted
    once, by its first choice); `reasoning`: the choices' reasoning tokens, where the reply can think;
    `prediction`: the request sent one (its drafts accepted and rejected are counted)."""
    outs = [out, *others]
    firsts = outs[::n]
    prompt = sum(len(o.prompt_token_ids) for o in firsts)
    completion = sum(len(o.token_ids) for o in outs)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in firsts)},
    }
    details: dict[str, int] = {}
    if reasoning is not None:
        details["reasoning_tokens"] = reasoning
    if prediction:
        accepted = sum(o.num_accepted_prediction_tokens for o in outs)
        details["accepted_prediction_tokens"] = accepted
        details["rejected_prediction_tokens"] = sum(o.num_prediction_tokens for o in outs) - accepted
    if details:
        usage["completion_tokens_details"] = details
    return usage


def chat_tools(body: dict) -> list[dict[str, Any]] | None:
    """The request's `tools`, each {"type": "function", "function": {"name", "parameters"?, ...}} (a custom
    tool as the function it is shown as)."""
    tools = field(body, "tools", list)
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ApiError(
                400, f'tools[{i}] must be an object ({{"type": "function", "function": {{...}}}})', "tools"
            )
        kind = tool.get("type", "function")
        if kind == "custom":
            out.append(custom_function(tool.get("custom"), f"tools[{i}].custom"))
            continue
        if kind != "function":
            raise not_a_function_tool(i, kind)
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(400, f"tools[{i}].function needs a string 'name'", "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ApiError(400, f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        out.append({k: v for k, v in tool.items() if k != "cache_control"})  # (a hint, not the model's)
    return out


def _prediction(state: ServerState, body: dict) -> tuple[int, ...]:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or [{"type": "text", ...}]} as token
    ids; () without one."""
    prediction = field(body, "prediction", dict)
    if prediction is None:
        return ()
    if prediction.get("type") != "content":
        raise ApiError(
            400, f"'prediction.type' must be 'content' (got {prediction.get('type')!r})", "prediction"
        )
    content = prediction.get("content")
    if isinstance(content, list):
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise ApiError(
                400, '\'prediction.content\' parts must be {"type": "text", "text": ...}', "prediction"
            )
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(400, "'prediction.content' must be a string or an array of text parts", "prediction")
    if content and not state.engine.llm.engine_config.num_draft_tokens and not state.prediction_warned:
        state.prediction_warned = True
        log.warning(
            "requests send predictions (Predicted Outputs), which draft only with speculative decoding; "
            "start the server with --spec ngram (or mtp / draft) to use them"
        )
    return tuple(state.text_tokenizer().encode(content, add_special_tokens=False)) if content else ()


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _tool_call_json(call: ToolCall, custom: frozenset[str]) -> dict[str, Any]:
    """A call as chat completions' tool_calls entry (a custom tool's: its input string; one the reply
    ended inside: its arguments as far as they were written)."""
    cid = _call_id()
    if call.name in custom:
        return {
            "id": cid,
            "type": "custom",
            "custom": {"name": call.name, "input": custom_input(call.arguments)},
        }
    arguments = call.partial if call.partial is not None else arguments_json(call.arguments)
    return {"id": cid, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def finish_reason(out: RequestOutput) -> str | None:
    return {"stop": "stop", "length": "length", "abort": "stop"}.get(
        out.finish_reason or "", out.finish_reason
    )


def stream_error(message: str) -> str:
    """The server-sent event that ends an OpenAI stream early."""
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    return f"data: {json.dumps({'error': error})}\n\n"


def token_logprobs(
    out: RequestOutput, top: int, start: int = 0
) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """(token id, logprob, the top-N (token id, logprob) alternatives) of each output token from `start` on."""
    return [
        (token, lp.get(token, float("-inf")), top_alternatives(lp, top))
        for token, lp in zip(out.token_ids[start:], (out.logprobs or [])[start:])  # (a stream's new ones)
    ]


def template_kwargs(body: dict) -> dict[str, Any]:
    """What a chat completion's template hears from the request: its chat_template_kwargs, over what its
    reasoning_effort says (the server's --chat-template-kwargs lie under both)."""
    return with_effort(
        field(body, "chat_template_kwargs", dict, {}),
        field(body, "reasoning_effort", str),
        "reasoning_effort",
    )


def template_options(body: dict) -> tuple[bool, bool]:
    """vLLM's `continue_final_message` (the reply continues the last, assistant, message: a prefill) and
    `add_generation_prompt` (default true; with a continued message it does not apply)."""
    return field(body, "continue_final_message", bool, False), field(
        body, "add_generation_prompt", bool, True
    )


def _logprobs_content(names: TokenNames, out: RequestOutput, top: int, start: int = 0) -> dict[str, Any]:
    """OpenAI's logprobs.content for the output tokens from `start` on."""
    return {
        "content": [
            {**names.entry(token, logprob), "top_logprobs": [names.entry(t, v) for t, v in alts]}
            for token, logprob, alts in token_logprobs(out, top, start)
        ]
    }


def _model_card(state: ServerState, model_id: str | None = None) -> dict[str, Any]:
    """A served model in OpenAI's shape (id, object, created, owned_by), vLLM's (max_model_len; a LoRA
    adapter's root and parent) and Anthropic's (type, display_name, created_at, max_input_tokens, max_tokens,
    lifecycle, capabilities: engine/api/model_capabilities.py), so either SDK's models API reads it. `model_id`: one of the LoRA adapters; None: the base model."""
    card = {
        "id": model_id or state.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "ninfer",
        "max_model_len": state.max_context,  # vLLM's field: the context limit (--max-context)
        "type": "model",
        "display_name": model_id or state.model_id,
        "created_at": datetime.fromtimestamp(state.started, timezone.utc).isoformat().replace("+00:00", "Z"),
        "max_input_tokens": state.max_context,  # Anthropic's: the context window
        "max_tokens": state.max_context - 1,  # and the most max_tokens a request may ask for
        "lifecycle": "active",
        "capabilities": anthropic_capabilities(state),
    }
    if model_id is not None:
        card.update(root=state.engine.llm.adapters.paths[model_id], parent=state.model_id)
    return card


def _adapter_names(state: ServerState) -> list[str]:
    return state.engine.llm.adapters.names


@router.get("/v1/models")
async def models(request: Request):
    state: ServerState = request.app.state.ninfer
    cards = [_model_card(state)] + [_model_card(state, name) for name in _adapter_names(state)]
    return {
        "object": "list",
        "data": cards,
        "has_more": False,  # Anthropic's page fields
        "first_id": cards[0]["id"],
        "last_id": cards[-1]["id"],
    }


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request):
    state: ServerState = request.app.state.ninfer
    if model_id in _adapter_names(state):
        return _model_card(state, model_id)
    if model_id != state.model_id:
        served = ", ".join(f"'{m}'" for m in [state.model_id, *_adapter_names(state)])
        raise ApiError(404, f"no model '{model_id}' here; this server serves {served}", "model")
    return _model_card(state)


def _text_replies_only(body: dict) -> None:
    """What the reply cannot be here, refused rather than left out of it: spoken audio (`modalities`,
    `audio`) and OpenAI's own web search (`web_search_options`)."""
    modalities = body.get("modalities")
    if modalities is not None:
        if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
            raise ApiError(400, "'modalities' must be an array of strings, such as [\"text\"]", "modalities")
        other = [m for m in modalities if m != "text"]
        if other:
            raise ApiError(
                400,
                f"'modalities' asks for {', '.join(other)}; this server writes text only: send [\"text\"] or "
                "leave it out",
                "modalities",
            )
    if body.get("audio") is not None:
        raise ApiError(
            400, "'audio' sets a spoken reply, which this server does not write; leave it out", "audio"
        )
    if body.get("web_search_options") is not None:
        raise ApiError(
            400,
            "'web_search_options': this server has no web search; leave it out, or give the model a search "
            "tool of your own in 'tools'",
            "web_search_options",
        )


async def _snapshot_hints(
    state: ServerState, body: dict, tools: list | None, kwargs: dict, text: str, ids: list[int]
) -> tuple[int, ...]:
    """Where the rendered prompt's tool list and `cache_control` prefixes end, in its tokens
    (engine/api/snapshot_hints.py): for an engine that snapshots a recurrent state; none for the others,
    which reuse any page anyway."""
    if not state.engine.snapshots_enabled:
        return ()

    def render(cut: dict) -> str:  # a cut request as the prompt renders it
        listed = chat_tools(cut) if tools is not None else None
        return state.render_text(template_messages(cut["messages"], state.reads_images)[0], listed, kwargs)

    points = snapshot_hints.find_openai(body)
    return await snapshot_hints.of_marks(state, body, points, render, tools, kwargs, text, ids)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    messages, images = template_messages(body.get("messages"), state.reads_images)
    n = num_choices(body)
    if body.get("functions") or body.get("function_call") is not None:
        raise ApiError(
            400,
            "'functions' / 'function_call' are OpenAI's deprecated form; send 'tools' "
            '([{"type": "function", "function": {...}}]) and \'tool_choice\'',
            "functions",
        )
    _text_replies_only(body)
    tools, custom = chat_tools(body), custom_names(body.get("tools"))
    if body.get("tool_choice") == "none":
        tools = None  # the model neither sees nor may call them
    kwargs = template_kwargs(body)
    snapshot_hints.find_openai(body)  # each cache_control checked (engine/api/snapshot_hints.py)
    stream = field(body, "stream", bool, False)
    top_logprobs = _logprobs_settings(body)
    names = token_names(state, body)
    max_tokens_field = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    grammar = openai_grammar(body, tools, state.engine.tokenizer)
    prompt_top = prompt_logprobs_field(body)
    params = sampling_params(
        state,
        body,
        max_tokens_field,
        state.default_max_tokens(),
        stop_list(body),
        logprobs=top_logprobs,
        grammar=grammar,
        prompt_logprobs=prompt_top,
        prediction=await asyncio.to_thread(_prediction, state, body),  # (a whole file, perhaps)
    )
    params = with_progress(params, body)  # llama-server's return_progress
    prompt_text, ids = await asyncio.to_thread(state.render, messages, tools, kwargs, *template_options(body))
    if images.items and body.get("truncate_prompt_tokens") is not None:
        raise ApiError(
            400,
            "'truncate_prompt_tokens' does not go with images (a cut could split one)",
            "truncate_prompt_tokens",
        )
    rendered = len(ids)
    ids = truncated_prompt(body, ids, state.max_context, params.max_tokens)
    # where the tool list and the cache_control prefixes end (a truncated prompt's positions moved: none)
    cut = len(ids) < rendered
    hints = () if cut else await _snapshot_hints(state, body, tools, kwargs, prompt_text, ids)
    usage_options = stream_usage(body, stream, [ids])
    max_calls = None if field(body, "parallel_tool_calls", bool, True) else 1
    in_reasoning = prompt_text.rstrip().endswith("<think>")
    predicted = body.get("prediction") is not None

    def thought(outs) -> int:
        return sum(reasoning_tokens(state.engine.tokenizer, o, in_reasoning) for o in outs if o is not None)

    clock = Clock()  # llama-server's `timings` (of one choice) and `prompt_progress`
    return_ids = token_ids_asked(body)
    preprocessed = await preprocess_images(state, images)
    streams = await start_choices(state, [ids], params, n, preprocessed, hints)
    rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", now()
    if not stream:
        outs = await collect_choices(state, streams, request, clock.token if n == 1 else None)
        choices = []
        for index, out in enumerate(outs):
            reasoning, content, calls = parse_reply(out.text, in_reasoning, tools, max_calls, cut_calls=True)
            # a call the reply ended inside is sent as the stream sends it (a custom tool's not at all)
            calls = [c for c in calls if c.partial is None or c.name not in custom]
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content if content or not calls else None,
            }
            if reasoning:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [_tool_call_json(c, custom) for c in calls]
            finished_calls = any(c.partial is None for c in calls)
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "finish_reason": "tool_calls" if finished_calls else finish_reason(out),
                "logprobs": None,
            }
            if top_logprobs is not None:
                choice["logprobs"] = _logprobs_content(names, out, top_logprobs)
            choices.append(choice)
        response = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": state.reply_model(params),
            "choices": choices,
            "usage": usage_json(*outs, n=n, reasoning=thought(outs), prediction=predicted),
        }
        if return_ids:
            response["prompt_token_ids"] = list(outs[0].prompt_token_ids)
            for choice, out in zip(choices, outs, strict=True):
                choice["token_ids"] = list(out.token_ids)
        if n == 1:
            response["timings"] = clock.timings(outs[0])
        if prompt_top is not None:
            response["prompt_logprobs"] = vllm_prompt_logprobs(state, outs[0], prompt_top)
        return JSONResponse(response)

    last: list[RequestOutput | None] = [None] * len(streams)  # each choice's latest output
    sent_ids, prompt_ids_sent = TokenIds(return_ids, len(streams)), []  # vLLM's return_token_ids

    def chunk(
        delta: dict[str, Any],
        finish: str | None = None,
        usage: dict | None = None,
        index: int | None = 0,
        logprobs: dict | None = None,
        timings: dict | None = None,
        progress: dict | None = None,
    ) -> str:
        payload: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": state.reply_model(params),
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]
            if index is not None
            else [],
        }
        if sent_ids.on and index is not None:
            payload["choices"][0]["token_ids"] = sent_ids.take(index)
            if not prompt_ids_sent:
                prompt_ids_sent.append(True)
                payload["prompt_token_ids"] = state.with_images(ids, preprocessed)  # as the engine runs it
        if progress is not None:
            payload["prompt_progress"] = progress
        elif usage is not None:
            payload["usage"] = usage
        else:
            usage_options.add_to(payload, last)
        if timings is not None:
            payload["timings"] = timings
        return f"data: {json.dumps(payload)}\n\n"

    async def events():
        parsers = [ReplyParser(in_reasoning, tools, max_calls, stream_calls=True) for _ in streams]
        num_calls, sent_logprobs = [0] * len(streams), [0] * len(streams)
        # per choice: tool_calls entries begun (their index), and whether the call under way streams (a
        # function's; a custom tool's input comes whole with the finished call)
        begun, streaming = [0] * len(streams), [False] * len(streams)
        outputs = merged(streams)
        ticks = with_keepalive(outputs)  # the outputs, and a None whenever they keep silent
        try:
            for index in range(len(streams)):
                yield chunk({"role": "assistant", "content": ""}, index=index)
            async for item in ticks:
                if item is None:  # nothing yet (a long prompt prefilling): keep the connection alive
                    yield SSE_KEEPALIVE
                    continue
                index, out, delta = item
                if out.prompt_progress is not None:  # between prompt chunks: a chunk of no choice
                    yield chunk({}, index=None, progress=clock.progress(out))
                    continue
                last[index] = out
                sent_ids.seen(index, out)
                failure = stream_failure(state, out)
                if failure is not None:
                    yield stream_error(failure)
                    return
                state.metrics.token(out)
                if n == 1:
                    clock.token(out)
                if top_logprobs is not None and len(out.logprobs or ()) > sent_logprobs[index]:
                    # the new tokens' logprobs, in a chunk of their own (text may be held back a while)
                    logprobs = _logprobs_content(names, out, top_logprobs, sent_logprobs[index])
                    yield chunk({}, index=index, logprobs=logprobs)
                    sent_logprobs[index] = len(out.logprobs)
                for kind, piece in parsers[index].feed(delta, final=out.finished):
                    if kind == "tool_call_start":
                        streaming[index] = piece not in custom
                        if streaming[index]:
                            fn = {"name": piece, "arguments": ""}
                            call = {
                                "index": begun[index],
                                "id": _call_id(),
                                "type": "function",
                                "function": fn,
                            }
                            yield chunk({"tool_calls": [call]}, index=index)
                    elif kind == "tool_call_args":
                        if streaming[index]:
                            call = {"index": begun[index], "function": {"arguments": piece}}
                            yield chunk({"tool_calls": [call]}, index=index)
                    elif kind in ("tool_call", "tool_call_end"):
                        if kind == "tool_call" and not streaming[index]:
                            call = {"index": begun[index], **_tool_call_json(piece, custom)}
                            yield chunk({"tool_calls": [call]}, index=index)
                        if kind == "tool_call" or streaming[index]:
                            begun[index] += 1
                        num_calls[index] += kind == "tool_call"  # a call cut short does not finish as one
                        streaming[index] = False
                    else:
                        yield chunk(
                            {"reasoning_content" if kind == "reasoning" else "content": piece}, index=index
                        )
                if out.finished:
                    state.metrics.finished(out)
                    why = "tool_calls" if num_calls[index] else finish_reason(out)
                    timings = clock.timings(out) if n == 1 else None
                    yield chunk({}, why, index=index, timings=timings)
            if usage_options.include:
                totals = usage_json(*last, n=n, reasoning=thought(last), prediction=predicted)
                yield chunk({}, usage=totals, index=None)
            yield "data: [DONE]\n\n"
        finally:
            await ticks.aclose()  # (its reader first: it reads the outputs)
            await outputs.aclose()  # the client went away mid-stream: their KV is freed now

    return StreamingResponse(guarded(events(), stream_error), media_type="text/event-stream")
