"""One scheduling code path: each step gives every request a number of tokens to run.

A request's tokens are prompt + output; it runs `num_tokens - num_computed_tokens` of them, capped by the
step's token budget. That one rule covers prefill, chunked prefill and decode. Running requests go
first (decode latency), then waiting ones are admitted while there are slots, pages and budget.
When pages run out, the most recently admitted request is preempted: its pages are freed and it is
recomputed later from its prompt and the tokens it already produced.
"""

from __future__ import annotations

from collections import deque

from engine.cache.block_pool import BlockPool
from engine.cache.state_pool import StatePool
from engine.errors import NinferError
from engine.request import Request, RequestStatus
from engine.scheduler.output import RunnerOutput, ScheduledRequest, SchedulerOutput


class Scheduler:
    def __init__(
        self,
        block_pool: BlockPool,
        state_pool: StatePool | None,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ):
        self.block_pool, self.state_pool = block_pool, state_pool
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        n = request.num_prompt_tokens
        if n == 0:
            raise NinferError("the prompt is empty; give at least one token")
        if n >= self.max_model_len:
            raise NinferError(
                f"the prompt is {n} tokens but the context limit is {self.max_model_len} (max_model_len); "
                "shorten the prompt or raise max_model_len"
            )
        capacity = self.block_pool.num_blocks * self.block_pool.block_size
        if n + 1 > capacity:
            raise NinferError(
                f"the prompt is {n} tokens but the KV cache holds {capacity}; raise the KV capacity"
            )
        if request.request_id in self.requests:
            raise NinferError(f"request id {request.request_id} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self._grow(req, req.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            else:
                scheduled.append(self._scheduled(req, n))
                budget -= n
                i += 1
                continue
            break  # req itself was preempted; it was the last running request
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if self.state_pool is not None and self.state_pool.num_free_slots == 0:
                break
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._grow(req, req.num_computed_tokens + n):
                break
            self.waiting.popleft()
            if self.state_pool is not None:
                req.state_slot = self.state_pool.allocate()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append(self._scheduled(req, n))
            budget -= n
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(scheduled, finished)

    def _scheduled(self, req: Request, n: int) -> ScheduledRequest:
        start = req.num_computed_tokens
        return ScheduledRequest(
            request_id=req.request_id,
            token_ids=req.all_token_ids[start : start + n],
            start_pos=start,
            block_ids=req.block_ids,
            state_slot=req.state_slot,
            sample=start + n == req.num_tokens,
            sampling_params=req.sampling_params,
            history=(req.prompt_token_ids, req.output_token_ids)
            if req.sampling_params.has_penalties
            else None,
        )

    def _grow(self, req: Request, num_tokens: int) -> bool:
        need = self.block_pool.blocks_needed(num_tokens, len(req.block_ids))
        if need > self.block_pool.num_free_blocks:
            return False
        req.block_ids.extend(self.block_pool.allocate(need))
        return True

    def _release(self, req: Request) -> None:
        self.block_pool.free(req.block_ids)
        req.block_ids = []
        if req.state_slot >= 0:
            self.state_pool.free(req.state_slot)
            req.state_slot = -1

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        self._finished_ids.append(req.request_id)  # the runner drops its per-request state
        self.num_preemptions += 1

    def update_from_output(self, sched: SchedulerOutput, out: RunnerOutput) -> list[Request]:
        """Advance requests by what ran; append sampled tokens; return requests that got a new token."""
        updated = []
        for s in sched.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status != RequestStatus.RUNNING:
                continue  # aborted during the step
            req.num_computed_tokens += len(s.token_ids)
            sampled = out.sampled.get(s.request_id)
            if sampled is None:
                continue
            req.output_token_ids.append(sampled.token_id)
            if sampled.logprobs is not None:
                req.output_logprobs.append(sampled.logprobs)
            reason = self._stop_reason(req, sampled.token_id)
            if reason is not None:
                self.finish_request(req.request_id, reason)
            updated.append(req)
        return updated

    def _stop_reason(self, req: Request, token_id: int) -> str | None:
        params = req.sampling_params
        if not params.ignore_eos and token_id in req.eos_token_ids:
            return "stop"
        if token_id in params.stop_token_ids:
            return "stop"
        capacity = self.block_pool.num_blocks * self.block_pool.block_size
        if len(req.output_token_ids) >= params.max_tokens or req.num_tokens >= min(
            self.max_model_len, capacity
        ):
            return "length"
        return None

    def finish_request(self, request_id: str, reason: str) -> None:
        """Finish (or abort) a request: its pages and state slot are freed at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.remove(req)
        self._release(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self._finished_ids.append(request_id)
