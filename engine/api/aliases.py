"""Other servers' spellings of our routes, taken as ours: llama-server's OpenAI paths without `/v1`
(`/chat/completions`, `/completions`, `/models`; its `/embeddings` is its own: engine/api/llama_embedding.py)
and its `/v1/health`. The path is
rewritten before routing, so auth, error shapes and metrics see the route it stands for."""

from __future__ import annotations

ALIASES = {
    "/chat/completions": "/v1/chat/completions",
    "/completions": "/v1/completions",
    "/models": "/v1/models",
    "/v1/health": "/health",
}


def canonical(path: str) -> str:
    """The route a path stands for (itself when it is no alias); `/models/{id}` is `/v1/models/{id}`."""
    if path.startswith("/models/"):
        return "/v1" + path
    return ALIASES.get(path.rstrip("/") or "/", path)
