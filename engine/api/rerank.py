"""Reranking over HTTP, for a reranker (engine/rerank.py): Cohere / Jina's `POST /v1/rerank` (also `/rerank`,
`/v2/rerank`, and llama-server's `/reranking`, `/v1/reranking`) — `query`, `documents` (strings or
{"text": ...}), `top_n`, `return_documents`, Cohere's `max_tokens_per_doc` —, the same routes in Hugging Face
TEI's shape (`texts` in, a bare array of {index, score} out, `return_text`, `raw_scores`, `truncate`), and
vLLM's `POST /score` / `/v1/score` (`text_1` against `text_2`: one against many, or pair by pair).
Qwen3-Reranker's task `instruction` may be sent with each (`instruct` too). Each pair is one pooled engine
request; the pairs share their prompt up to the document, so the prefix cache computes the query's part
once. Results are sorted by relevance, each with its document's index."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, Request

from engine.api.common import field, now, pooled, read_json
from engine.api.errors import ApiError
from engine.api.state import ServerState
from engine.errors import NinferError
from engine.rerank import NOT_A_RERANKER, RerankHead, sigmoid

router = APIRouter()
PATHS = ("/rerank", "/v2/rerank", "/reranking", "/score")  # the routes outside /v1/, guarded by the API key
MAX_DOCUMENTS = 1000  # as Cohere's recommended ceiling


@router.post("/v1/rerank")
@router.post("/rerank")
@router.post("/v2/rerank")
@router.post("/v1/reranking")
@router.post("/reranking")
async def rerank(request: Request):
    state, head, body = await _opened(request)
    tei = "texts" in body and "documents" not in body
    key = "texts" if tei else "documents"
    query = _text(body.get("query"), "query")
    documents = _documents(body.get(key), key)
    top_n = field(body, "top_n", int)
    if top_n is not None and top_n < 1:
        raise ApiError(
            400, f"'top_n' must be 1 or more, or left out for every document (got {top_n})", "top_n"
        )
    limit = _per_doc_limit(body, tei)
    log_odds, tokens = await _scored(state, head, request, [(query, d) for d in documents], body, limit)
    raw = tei and field(body, "raw_scores", bool, False)
    scores = log_odds if raw else [sigmoid(x) for x in log_odds]
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    if tei:
        text = field(body, "return_text", bool, False)
        return [{"index": i, "score": scores[i], **({"text": documents[i]} if text else {})} for i in order]
    with_documents = field(body, "return_documents", bool, True)
    results = [
        {
            "index": i,
            "relevance_score": scores[i],
            **({"document": {"text": documents[i]}} if with_documents else {}),
        }
        for i in order
    ]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": state.model_id,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


@router.post("/v1/score")
@router.post("/score")
async def score(request: Request):
    state, head, body = await _opened(request)
    first, second = _side(body.get("text_1"), "text_1"), _side(body.get("text_2"), "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ApiError(
            400,
            f"'text_1' holds {len(first)} texts and 'text_2' {len(second)}; send one text_1 for all, or as many "
            "as text_2 (scored pair by pair)",
            "text_1",
        )
    log_odds, tokens = await _scored(state, head, request, list(zip(first, second)), body, None)
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": now(),
        "model": state.model_id,
        "data": [{"index": i, "object": "score", "score": sigmoid(x)} for i, x in enumerate(log_odds)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


async def _opened(request: Request) -> tuple[ServerState, RerankHead, dict]:
    """The server's state, the reranker's head (another model is refused before the body is read), the body."""
    state: ServerState = request.app.state.ninfer
    head = state.engine.llm.rerank_head
    if head is None:
        raise ApiError(400, NOT_A_RERANKER)
    return state, head, await read_json(request)


async def _scored(
    state: ServerState,
    head: RerankHead,
    request: Request,
    pairs: list[tuple[str, str]],
    body: dict,
    limit: int | None,
) -> tuple[list[float], int]:
    """Each pair's log-odds of relevance, and the prompt tokens they took."""
    instruction = field(body, "instruction", str, field(body, "instruct", str))
    prompts = await asyncio.to_thread(  # (off the event loop: many documents encode for a while)
        lambda: [
            _pair_ids(state, q, document, instruction, limit, i) for i, (q, document) in enumerate(pairs)
        ]
    )
    outs = await pooled(state, prompts, request, shared_prefix=True)
    return [head.log_odds(out.embedding) for out in outs], sum(len(ids) for ids in prompts)


def _pair_ids(
    state: ServerState, query: str, document: str, instruction: str | None, limit: int | None, index: int
) -> list[int]:
    """The pair's prompt; with `limit` (-1: whatever fits the context), the document cut to that many tokens."""
    llm, tok = state.engine.llm, state.text_tokenizer()
    room = state.max_context - 1  # the pooled request samples one token
    try:
        ids = llm.rerank_ids(query, document, instruction)
        if limit is None or (limit == -1 and len(ids) <= room):
            return _fits(ids, room, index)
        doc = tok.encode(document, add_special_tokens=False)
        keep = limit if limit != -1 else len(doc) - (len(ids) - room)
        if keep < 1:
            raise ApiError(
                400,
                f"the query and prompt alone take {len(ids) - len(doc)} of the {state.max_context} tokens of "
                "context (--max-context); no document fits beside them — shorten the query",
                "query",
            )
        if keep < len(doc):
            ids = llm.rerank_ids(query, tok.decode(doc[:keep]), instruction)
        return _fits(ids, room, index)
    except NinferError as e:
        raise ApiError(400, str(e)) from e


def _fits(ids: list[int], room: int, index: int) -> list[int]:
    if len(ids) > room:
        raise ApiError(
            400,
            f"document {index} with the query is {len(ids)} tokens, beyond the context limit {room + 1} "
            "(--max-context); shorten it, or send max_tokens_per_doc (truncate: true in TEI's shape)",
            code="context_length_exceeded",
        )
    return ids


def _per_doc_limit(body: dict, tei: bool) -> int | None:
    """The tokens a document keeps: Cohere's max_tokens_per_doc, or TEI's truncate (-1: as many as fit)."""
    if tei:
        return -1 if field(body, "truncate", bool, False) else None
    limit = field(body, "max_tokens_per_doc", int)
    if limit is not None and limit < 1:
        raise ApiError(400, f"'max_tokens_per_doc' must be 1 or more (got {limit})", "max_tokens_per_doc")
    return limit


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"'{name}' must be a non-empty string", name)
    return value


def _documents(value: Any, name: str) -> list[str]:
    """Strings, or objects with a `text` (Cohere v1, Jina), 1 to MAX_DOCUMENTS of them."""
    if not isinstance(value, list) or not value:
        raise ApiError(
            400, f"'{name}' must be a non-empty array of strings (or of {{\"text\": ...}} objects)", name
        )
    if len(value) > MAX_DOCUMENTS:
        raise ApiError(400, f"{len(value)} documents in one request; at most {MAX_DOCUMENTS}", name)
    texts = []
    for i, item in enumerate(value):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise ApiError(400, f"{name}[{i}] must be a string or an object with a string 'text'", name)
        texts.append(text)
    return texts


def _side(value: Any, name: str) -> list[str]:
    """vLLM's text_1 / text_2: a string or a non-empty array of strings."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ApiError(400, f"'{name}' must be a string or a non-empty array of strings", name)
    if len(value) > MAX_DOCUMENTS:
        raise ApiError(400, f"{len(value)} texts in '{name}'; at most {MAX_DOCUMENTS}", name)
    return value
