"""Drafts the model runner made after a step (the MTP head's), kept for the request's next step."""

from __future__ import annotations

import torch

from engine.request import Request


def per_request(request_ids: list[str], steps: list[tuple[list[int], torch.Tensor]]) -> dict[str, list[int]]:
    """A chained drafter's drafts by request: `steps` holds, per chained step, the chains still drafting
    (indices into `request_ids`) and their drafts [n] on the device, read back here in one transfer."""
    flat = torch.cat([d for _, d in steps]).tolist()
    drafts: dict[str, list[int]] = {rid: [] for rid in request_ids}
    i = 0
    for chain_ids, _ in steps:
        for c in chain_ids:
            drafts[request_ids[c]].append(flat[i])
            i += 1
    return drafts


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
