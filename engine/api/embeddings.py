"""OpenAI embeddings: `POST /v1/embeddings`. Each input (a string, token ids, or an array of either) is one
engine request pooled at its prompt's last token (engine/pooling.py; meaningful with an embedding model such
as Qwen3-Embedding, whose tokenizer ends a text with its end-of-text token), at most `--max-concurrency` of
them running at once so a large batch does not fill the admission queue. `encoding_format` float or base64
(little-endian float32, what the official SDK asks for), `dimensions` (the first N, normalized again:
Matryoshka), vLLM's `normalize` (default true) and `truncate_prompt_tokens` (an input's last N tokens; -1:
as many as fit)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from engine.api.common import field, is_token_id, pooled, read_json, truncated_prompt
from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.errors import NinferError
from engine.pooling import truncated

router = APIRouter()
MAX_INPUTS = 2048  # as OpenAI's API


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    return await openai_embeddings(request.app.state.ninfer, await read_json(request), request)


async def openai_embeddings(state: ServerState, body: dict, request: Request) -> dict[str, Any]:
    """The OpenAI reply to an embeddings body (also llama-server's routes' for an `input` body)."""
    prompts = await input_prompts(state, body, "input")
    encoding = field(body, "encoding_format", str, "float")
    if encoding not in ("float", "base64"):
        raise ApiError(
            400, f"'encoding_format' must be float or base64 (got {encoding!r})", "encoding_format"
        )
    dimensions = field(body, "dimensions", int)
    normalize = field(body, "normalize", bool, True)
    if dimensions is not None and dimensions < 1:
        raise ApiError(400, f"'dimensions' must be at least 1 (got {dimensions})", "dimensions")
    outs = await pooled(state, prompts, request)
    data = []
    for index, out in enumerate(outs):
        try:
            vector = truncated(out.embedding, dimensions, normalize)
        except NinferError as e:
            raise ApiError(400, str(e), "dimensions") from e
        data.append({"object": "embedding", "index": index, "embedding": _encoded(vector, encoding)})
    tokens = sum(len(ids) for ids in prompts)
    return {
        "object": "list",
        "data": data,
        "model": state.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def input_prompts(state: ServerState, body: dict, name: str) -> list[list[int]]:
    """`inputs`, encoded off the event loop (many long texts take a while), each cut as
    `truncate_prompt_tokens` asks."""
    encoded = await asyncio.to_thread(inputs, state, body, name)
    return [truncated_prompt(body, ids, state.max_context, 1) for ids in encoded]


def inputs(state: ServerState, body: dict, name: str) -> list[list[int]]:
    """The body's field `name`: a string, token ids, or an array of several (strings or token-id arrays),
    each encoded."""
    value = body.get(name)
    shape = f"'{name}' must be a string, an array of token ids, or an array of strings or of token-id arrays"
    if isinstance(value, str) or (isinstance(value, list) and value and all(is_token_id(t) for t in value)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, shape, name)
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"{len(value)} inputs in one request; at most {MAX_INPUTS}", name)
    prompts = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            prompts.append(state.text_tokenizer().encode(item))
        elif isinstance(item, list) and item and all(is_token_id(t) for t in item):
            prompts.append(list(item))
        elif item == "" or item == []:
            raise ApiError(400, f"{name} {i} is empty; every input needs at least one token", name)
        else:
            raise ApiError(400, shape, name)
    return prompts


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
