"""Drafts the model runner made after a step (the MTP head's), kept for the request's next step."""

from __future__ import annotations

from engine.request import Request


class StoredDrafts:
    def __init__(self):
        self._drafts: dict[str, tuple[int, list[int]]] = {}  # request id -> (tokens they follow, drafts)

    def store(self, request_id: str, num_tokens: int, drafts: list[int]) -> None:
        self._drafts[request_id] = (num_tokens, drafts)

    def forget(self, request_id: str) -> None:
        self._drafts.pop(request_id, None)

    def propose(self, req: Request, max_tokens: int) -> list[int]:
        """The stored drafts, when they were made for exactly the request's tokens now (a step without a
        sample since, or a preemption, leaves them stale)."""
        num_tokens, drafts = self._drafts.get(req.request_id, (-1, []))
        return drafts[:max_tokens] if num_tokens == req.num_tokens else []
