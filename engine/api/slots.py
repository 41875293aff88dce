"""llama-server's `GET /slots`: each of the server's `--max-concurrency` slots, idle or running a request:
the sampling it runs with (as /props gives the served defaults), how many tokens it has decoded and may
still decode, and how far its prompt has come. A request keeps its slot number while it runs (the lowest
free one when first seen); `?fail_on_no_slot=1` answers 503 when every slot is busy. Behind --api-key, as
llama-server keeps it: it shows what others' requests sample with. A debugging view, read without locking:
a request's counts may be a step behind."""

from __future__ import annotations

import itertools
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.api.common import sampling_params
from engine.api.errors import ApiError
from engine.api.llama_cpp import generation_settings
from engine.api.state import ServerState

router = APIRouter()
PATHS = ("/slots",)


class SlotNumbers:
    """Stable slot numbers for the running requests, and a task number each (llama-server's id_task)."""

    def __init__(self):
        self.slot: dict[str, int] = {}
        self.task: dict[str, int] = {}
        self._tasks = itertools.count()

    def assign(self, request_ids: list[str]) -> None:
        """Forget the requests no longer running; give the new ones the lowest free slots."""
        running = set(request_ids)
        for rid in [r for r in self.slot if r not in running]:
            del self.slot[rid], self.task[rid]
        taken = set(self.slot.values())
        free = (n for n in itertools.count() if n not in taken)
        for rid in request_ids:
            if rid not in self.slot:
                self.slot[rid], self.task[rid] = next(free), next(self._tasks)


def _numbers(request: Request) -> SlotNumbers:
    numbers = getattr(request.app.state, "ninfer_slots", None)
    if numbers is None:
        numbers = request.app.state.ninfer_slots = SlotNumbers()
    return numbers


@router.get("/slots")
async def slots(request: Request) -> Any:
    state: ServerState = request.app.state.ninfer
    fail = request.query_params.get("fail_on_no_slot")
    if fail not in (None, "0", "1", "true", "false"):
        raise ApiError(400, f"fail_on_no_slot must be 1 or 0 (got {fail!r})", "fail_on_no_slot")
    llm = state.engine.llm
    total = llm.engine_config.max_concurrency
    running = state.engine.running_requests()
    numbers = _numbers(request)
    numbers.assign([r.request_id for r in running])
    if fail in ("1", "true") and len(running) >= total:
        raise ApiError(503, f"no slot available: all {total} are busy (--max-concurrency)")
    tok = state.text_tokenizer()
    defaults = generation_settings(sampling_params(state, {}, "max_tokens", 1, None), -1)
    speculative = llm.engine_config.spec != "none"
    by_slot = {numbers.slot[r.request_id]: r for r in running}
    out = []
    for n in range(max(total, len(running))):
        req = by_slot.get(n)
        entry: dict[str, Any] = {
            "id": n,
            "id_task": -1,
            "n_ctx": state.max_context,
            "speculative": speculative,
            "is_processing": req is not None,
            "params": defaults,
            "next_token": {"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0},
        }
        if req is not None:
            params, decoded = req.sampling_params, len(req.output_token_ids)
            last = req.output_token_ids[-1:] if decoded else []
            entry.update(
                id_task=numbers.task[req.request_id],
                request_id=req.request_id,
                params=generation_settings(params, params.max_tokens),
                n_prompt_tokens=req.num_prompt_tokens,
                n_prompt_tokens_processed=min(req.num_computed_tokens, req.num_prompt_tokens),
                next_token={
                    "has_next_token": True,
                    "has_new_line": "\n" in tok.decode(last) if last else False,
                    "n_remain": max(params.max_tokens - decoded, 0),
                    "n_decoded": decoded,
                },
            )
        out.append(entry)
    return JSONResponse(out)
