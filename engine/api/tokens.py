"""vLLM's tokenizer routes: /tokenize, /detokenize and /tokenizer_info (which lm-evaluation-harness's
remote tokenizer reads, so it counts and cuts prompts with the served model's own tokenizer), and
llama-server's /apply-template (the rendered chat prompt)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from engine.api.common import field, is_token_id, read_json
from engine.api.errors import ApiError
from engine.api.images import preprocess_images
from engine.api.openai import chat_tools, template_kwargs, template_messages, template_options
from engine.api.state import ServerState

router = APIRouter()
PATHS = ("/tokenize", "/detokenize", "/tokenizer_info", "/apply-template")  # behind --api-key like /v1/*


@router.post("/tokenize")
async def tokenize(request: Request):
    """`messages` (rendered with the chat template, as chat completions does) or `prompt` (with the
    tokenizer's special tokens unless `add_special_tokens` is false), or llama-server's `content` (special
    tokens with `add_special`, each token's text with `with_pieces`); answers count, tokens and
    max_model_len."""
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    if body.get("messages") is not None:
        kwargs = template_kwargs(body)
        messages, images = template_messages(body.get("messages"), state.reads_images)
        _, ids = await asyncio.to_thread(
            state.render, messages, chat_tools(body), kwargs, *template_options(body)
        )
        ids = state.with_images(ids, await preprocess_images(state, images))
    elif isinstance(body.get("prompt"), str):
        special = field(body, "add_special_tokens", bool, True)
        ids = await asyncio.to_thread(state.text_tokenizer().encode, body["prompt"], special)
    elif isinstance(body.get("content"), str):  # llama-server's form
        special = field(body, "add_special", bool, False)
        ids = await asyncio.to_thread(state.text_tokenizer().encode, body["content"], special)
        if field(body, "with_pieces", bool, False):
            decode = state.engine.tokenizer.decode
            pieces = await asyncio.to_thread(  # (off the event loop: a token at a time, ~2 us each)
                lambda: [{"id": t, "piece": decode([t], skip_special_tokens=False)} for t in ids]
            )
            return {"tokens": pieces, "count": len(ids), "max_model_len": state.max_context}
    else:
        raise ApiError(400, "send 'messages' (chat), 'prompt' or 'content' (a string) to count", "messages")
    return {"count": len(ids), "tokens": ids, "max_model_len": state.engine.llm.max_context}


@router.post("/apply-template")
async def apply_template(request: Request):
    """llama-server's: the prompt the chat template makes of `messages` (and `tools`,
    `chat_template_kwargs`, `reasoning_effort`), as chat completions would run it, without running it."""
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    if body.get("messages") is None:
        raise ApiError(400, "send 'messages' (chat) to render with the chat template", "messages")
    kwargs = template_kwargs(body)
    messages, _ = template_messages(body.get("messages"), state.reads_images)
    prompt, _ = await asyncio.to_thread(
        state.render, messages, chat_tools(body), kwargs, *template_options(body)
    )
    return {"prompt": prompt}


@router.post("/detokenize")
async def detokenize(request: Request):
    """`tokens` (ids) back to text, special tokens included: as vLLM's `prompt` and llama-server's
    `content`."""
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    tokens = field(body, "tokens", list)
    vocab = state.engine.tokenizer.vocab_size
    if tokens is None or not all(is_token_id(t) and t < vocab for t in tokens):
        raise ApiError(400, f"'tokens' must be an array of token ids (0..{vocab - 1})", "tokens")
    text = await asyncio.to_thread(state.engine.tokenizer.decode, tokens, False)  # (off the event loop)
    return {"prompt": text, "content": text}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request):
    """The tokenizer's special tokens, chat template and context limit."""
    state: ServerState = request.app.state.ninfer
    tok = state.engine.tokenizer
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "unk_token": tok.unk_token,
        "add_bos_token": tok.add_bos_token,
        "chat_template": tok.chat_template,
        "model_max_length": state.engine.llm.max_context,
        "vocab_size": tok.vocab_size,
    }
