"""llama-server's own embeddings routes: `POST /embedding` and `POST /embeddings`.

A body with `content` (a string, token ids, or an array of several, as OpenAI's `input`) gets llama-server's
reply: a list of `{"index": i, "embedding": [[...]]}`, each input's one pooled vector nested in a list (where
llama-server with `--pooling none` would list a vector per token; this server pools at the last token), with
llama-server's `embd_normalize`: -1 none, 0 the largest magnitude scaled to 32760 (int16's range), 1 the sum
of magnitudes, 2 the Euclidean norm (the default), p > 2 the p-norm. A body with `input` instead gets the
OpenAI reply of `/v1/embeddings` (as earlier llama-servers answered it), so an OpenAI client whose base URL
lacks `/v1` is served too.
"""

from __future__ import annotations

import math

from fastapi import APIRouter, Request

from engine.api.common import field, pooled, read_json
from engine.api.embeddings import input_prompts, openai_embeddings
from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.pooling import normalized

router = APIRouter()
PATHS = ("/embedding", "/embeddings")  # outside /v1/: guarded by the API key all the same
INT16_SCALE = 32760.0  # llama-server's embd_normalize 0: the largest magnitude to this


@router.post("/embedding")
@router.post("/embeddings")
async def embedding(request: Request):
    state: ServerState = request.app.state.ninfer
    body = await read_json(request)
    if "content" not in body and "input" in body:
        return await openai_embeddings(state, body, request)
    norm = field(body, "embd_normalize", int, 2)
    if norm < -1:
        raise ApiError(
            400,
            f"'embd_normalize' must be -1 (none), 0 (int16 range), 1 (taxicab), 2 (Euclidean) or a larger p "
            f"(p-norm); got {norm}",
            "embd_normalize",
        )
    prompts = await input_prompts(state, body, "content")
    outs = await pooled(state, prompts, request)
    return [{"index": i, "embedding": [embd_normalized(out.embedding, norm)]} for i, out in enumerate(outs)]


def embd_normalized(vector: list[float], norm: int) -> list[float]:
    """`vector` divided by its embd_normalize norm (module docstring); a zero vector stays zero."""
    if norm == -1:
        return list(vector)
    if norm == 2:  # as /v1/embeddings normalizes
        return normalized(vector)
    if norm == 0:
        total = max((abs(v) for v in vector), default=0.0) / INT16_SCALE
    elif norm == 1:
        total = math.fsum(abs(v) for v in vector)
    else:  # from the largest magnitude, so that no power overflows however large p
        top = max((abs(v) for v in vector), default=0.0)
        total = top * math.fsum((abs(v) / top) ** norm for v in vector) ** (1.0 / norm) if top > 0 else 0.0
    scale = 1.0 / total if total > 0 else 0.0
    return [v * scale for v in vector]
