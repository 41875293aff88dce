"""One scheduling code path: each step gives every request a number of tokens to run.

A request's tokens are prompt + output; it runs `num_tokens - num_computed_tokens` of them, capped by the
step's token budget (`prefill_chunk`). That one rule covers prefill, chunked prefill and decode.

Admission policy (docs/architecture.md):
* Running requests go first, in admission order, so decode continues every step while a long prompt
  is prefilled in chunks with what is left of the budget.
* Waiting requests are admitted first-come first-served while there is a running slot
  (`max_concurrency`), a recurrent-state slot (hybrid models), pages and budget. The queue head
  blocks those behind it (no overtaking, so a long prompt is never starved).
* A new request is refused as overloaded when `max_pending` requests already wait beyond the free
  running slots; one that waits longer than `pending_timeout_ms` without being admitted expires.
* When pages run out mid-run, the most recently admitted request is preempted: its pages are freed
  (full ones stay in the prefix cache) and it is recomputed later from its prompt and the tokens it
  already produced, usually straight from the prefix cache. It is readmitted only when all those tokens
  fit, and any request only while a page each running request stays free beside its first chunk, so
  a request is not preempted again as soon as it is back (churn in a pool too small for both).
* At admission the longest cached prefix of full pages is reused (hybrid models: the longest one
  that also has a recurrent-state snapshot, on the GPU or in the host tier), always leaving at least one
  token to compute.

Speculative decoding (`num_draft_tokens`): a running request whose step reaches the end of its known
tokens also runs up to that many draft tokens (its prediction's where its output follows one,
engine/spec/prediction.py; else n-gram, engine/spec/ngram.py, or the MTP head's / draft model's from the
previous step, engine/spec/stored.py) when budget and spare pages allow (a page a running request stays
free for its own next token); the runner verifies them and the request advances by the tokens
accepted. A prediction drafts up to `num_prediction_tokens` a step (16 by default: a long span of a file
being rewritten verified at once) once its drafts keep being accepted (engine/spec/prediction.py), the
other methods `num_draft_tokens`. A hybrid model whose state saw a rejected draft is put back to the
step's start and recomputes the accepted tokens with its next step's drafts (decode is bandwidth-bound,
so extra positions per step cost little), at most 1 + the step's cap in all. Steps that snapshot a hybrid
state (a page completed) run no drafts: the snapshot must not hold them. With CUDA graphs (`pad_drafts`), a decode step
whose requests would verify different numbers of drafts pads the shorter ones (a repeat of their last
token: a real guess, verified like the others, rarely right) to the longest, within the same limits, so
the step has one query count and replays a graph instead of running eagerly; padding is left out of the
acceptance counters. A step with more than num_draft_tokens drafts (a prediction's) has no graph: it runs
eagerly and is not padded.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from engine.cache.block_pool import BlockPool, hash_blocks
from engine.cache.state_pool import StatePool
from engine.config import SchedulerConfig
from engine.errors import EngineOverloaded, NinferError, PromptTooLong
from engine.request import Request, RequestStatus
from engine.scheduler.bans import banned_rows
from engine.scheduler.output import RunnerOutput, ScheduledRequest, SchedulerOutput
from engine.scheduler.reuse import CacheReuse
from engine.scheduler.step_tokens import StepTokens
from engine.spec.ngram import NgramProposer
from engine.spec.prediction import PredictionDrafts
from engine.spec.stored import StoredDrafts

log = logging.getLogger("ninfer.scheduler")


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_pool: BlockPool,
        state_pool: StatePool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config, self.block_pool, self.state_pool, self.clock = config, block_pool, state_pool, clock
        self.block_size = block_pool.block_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self._preempted_ids: list[str] = []
        self.expired: list[Request] = []  # ended while waiting; the front end reports them
        self.num_preemptions = 0
        k = config.num_draft_tokens
        self.proposer = (
            (StoredDrafts() if config.spec in ("mtp", "draft") else NgramProposer(k)) if k else None
        )
        # a request's prediction (OpenAI's Predicted Outputs) drafts before the method above, where it can
        self.predictions = PredictionDrafts(k, config.most_prediction_drafts) if k else None
        self.num_draft_tokens = 0  # drafted and verified so far
        self.num_accepted_tokens = 0  # of those, accepted
        self.num_drafts = 0  # verifications: a request's drafts of one step, verified together
        # hybrid models: prompt tokens whose KV pages were cached at admission but computed again, no state
        # snapshot being at or past them (/metrics: a sign --state-snapshots is too few)
        self.num_state_lost_tokens = 0
        self.step_tokens = StepTokens()  # tokens per step that ran any (/metrics)
        # --cache-reuse: earlier sequences' pages taken at shifted positions (engine/scheduler/reuse.py)
        self.reuse = CacheReuse(config.cache_reuse, block_pool) if config.cache_reuse else None
        self._pinned: list[int] = []  # source pages of this step's copies: held until the next step

    def reset_counters(self) -> None:
        """Zero what /metrics counts (steps, preemptions, drafts, prefix-cache lookups): after a warm-up."""
        self.num_preemptions = self.num_draft_tokens = self.num_accepted_tokens = self.num_drafts = 0
        self.num_state_lost_tokens = 0
        self.step_tokens = StepTokens(self.step_tokens.buckets)
        self.block_pool.stats = type(self.block_pool.stats)()

    @property
    def snapshots_enabled(self) -> bool:
        return self.state_pool is not None and self.state_pool.num_snapshots > 0

    def add_request(self, request: Request) -> None:
        n, limit = request.num_prompt_tokens, self.config.max_context
        if n == 0:
            raise NinferError("the prompt is empty; give at least one token")
        if n >= limit:
            if request.mm is not None:  # the placeholders widened: most of the prompt may be pictures
                raise PromptTooLong(
                    f"with its images the prompt is {n} tokens but the context limit is {limit} (max_context); "
                    "send smaller or fewer images, or raise max_context",
                    n,
                    limit,
                )
            raise PromptTooLong(
                f"the prompt is {n} tokens but the context limit is {limit} (max_context); "
                "shorten the prompt or raise max_context",
                n,
                limit,
            )
        capacity = self.block_pool.num_blocks * self.block_size
        if n + 1 > capacity:
            raise NinferError(
                f"the prompt is {n} tokens but the KV cache holds {capacity}; raise kv_capacity"
            )
        if request.request_id in self.requests:
            raise NinferError(f"request id {request.request_id} is already in use")
        max_pending = self.config.max_pending
        if max_pending is not None:
            free_running = max(0, self.config.max_concurrency - len(self.running))
            queued = len(self.waiting) - free_running  # those the next step cannot admit
            if queued >= max_pending:
                raise EngineOverloaded(
                    f"overloaded: {queued} requests are already waiting for admission "
                    f"(max_pending={max_pending}); retry later or raise max_pending"
                )
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.block_pool.begin_step()
        if self._pinned:  # the last step's copies are done
            self.block_pool.free(self._pinned)
            self._pinned = []
        kv_shifts: list[tuple[int, int, int]] = []
        self._expire_waiting()
        budget = self.config.prefill_chunk
        scheduled: list[ScheduledRequest] = []
        state_saves: list[tuple[int, int]] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._num_to_run(req, budget)
            drafts, predicted = self._drafts(req, n, budget - n)
            end = req.num_computed_tokens + n
            if drafts and not self._grow_spare(req, end + len(drafts), end):
                drafts = []  # no pages to spare for guesses
            while not self._grow(req, req.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            else:
                self._grow_for_drafter(req, n + len(drafts))
                scheduled.append(self._scheduled(req, n, -1, state_saves, drafts, predicted and bool(drafts)))
                budget -= n + len(drafts)
                i += 1
                continue
            break  # req itself was preempted; it was the last running request
        num_running = len(scheduled)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_concurrency:
            req = self.waiting[0]
            if self.state_pool is not None and self.state_pool.num_free_slots == 0:
                break
            if self._waits_for_prompt(req):  # a few steps: its twin's prompt chunks are running
                break
            hit_blocks, host_hits, restore, kv_pages = self._lookup_prefix(req)
            num_cached = (len(hit_blocks) + len(host_hits)) * self.block_size
            reuse = self._plan_reuse(req, len(hit_blocks)) if not host_hits else None
            if reuse is not None:
                num_cached += reuse.num_tokens
            n = self._num_to_run(req, budget, num_cached)
            need = self.block_pool.blocks_needed(num_cached + n, len(hit_blocks))
            held = hit_blocks + (reuse.source_blocks if reuse is not None else [])
            reclaimed = sum(self.block_pool.ref_cnt[b] == 0 for b in dict.fromkeys(held))
            if not self._fits(req, need, len(hit_blocks), self.block_pool.num_free_blocks - reclaimed):
                break
            self.waiting.popleft()
            self.block_pool.touch(hit_blocks)
            if reuse is not None:  # held for this step, so no allocation evicts them before they are read
                self.block_pool.touch(reuse.source_blocks)
                self._pinned += reuse.source_blocks
            new_blocks = self.block_pool.allocate_with_host(need, host_hits)  # the first ones: copied back
            req.block_ids = hit_blocks + new_blocks
            req.num_computed_tokens = num_cached
            if reuse is not None:
                bs = self.block_size
                kv_shifts += [
                    (src, req.block_ids[pos // bs] * bs + pos % bs, shift) for src, pos, shift in reuse.copies
                ]
            req.num_registered_blocks = len(hit_blocks) + len(host_hits)
            if not req.admitted:
                req.admitted, req.num_cached_tokens = True, num_cached
                req.admitted_at = self.clock()
                self.block_pool.record_lookup(
                    req.num_prompt_tokens, num_cached, len(host_hits) * self.block_size
                )
                self.num_state_lost_tokens += (kv_pages - len(hit_blocks) - len(host_hits)) * self.block_size
            if self.state_pool is not None:
                req.state_slot = self.state_pool.allocate()
                if isinstance(restore, bytes):  # the snapshot is in the host tier: copied back first
                    at = (len(hit_blocks) + len(host_hits)) * self.block_size
                    restore = self.state_pool.take_from_host(restore, shared=at in self._shared_points(req))
                if restore != -1:  # (a preempted request resumes from its own: it keeps the earlier turn)
                    earlier = self._earlier_turn(req, len(hit_blocks) + len(host_hits))
                    req.resumes_turn_of = earlier or req.resumes_turn_of
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._grow_for_drafter(req, n)
            scheduled.append(self._scheduled(req, n, restore, state_saves))
            budget -= n
        if self.config.pad_drafts and len(scheduled) == num_running:  # nothing admitted: maybe all decode
            self._pad_drafts(scheduled, budget)
        if self.state_pool is not None:
            self.state_pool.end_step()
        finished, self._finished_ids = self._finished_ids, []
        preempted, self._preempted_ids = self._preempted_ids, []
        swap_out, swap_in = self.block_pool.drain_swaps()
        state_out, state_in = self.state_pool.drain_swaps() if self.state_pool is not None else ([], [])
        if scheduled:
            self.step_tokens.observe(sum(len(r.token_ids) for r in scheduled))
        return SchedulerOutput(
            scheduled, finished, state_saves, swap_out, swap_in, kv_shifts, preempted, state_out, state_in
        )

    def _plan_reuse(self, req: Request, num_hit_pages: int):
        """--cache-reuse's plan for a request being admitted past its `num_hit_pages` cached pages (None: off,
        nothing to take, or a request it does not apply to: images, prompt logprobs, an embedding, whose
        numbers the approximation would move, a hybrid model)."""
        if self.reuse is None or req.mm is not None or _needs_prompt_logprobs(req) or self.state_pool:
            return None
        if req.sampling_params.pooling is not None:
            return None
        start, end = num_hit_pages * self.block_size, req.num_tokens - 1  # the last token is computed
        return self.reuse.plan(req.cache_root, req.block_hashes, num_hit_pages, req.token_slice(start, end))

    def _waits_for_prompt(self, req: Request) -> bool:
        """Whether `req` waits for its `after` request, which is running its prompt (the same one)."""
        twin = self.requests.get(req.after) if req.after is not None else None
        return (
            twin is not None
            and twin.status == RequestStatus.RUNNING
            and twin.num_computed_tokens < twin.num_prompt_tokens
            and self.block_pool.enable_prefix_caching
        )

    def _num_to_run(self, req: Request, budget: int, start: int | None = None) -> int:
        start = req.num_computed_tokens if start is None else start
        n = min(req.num_tokens - start, budget)
        if self.snapshots_enabled:
            # end the chunk at the next snapshot position, so the state there can be saved
            stop = next((p for p in self._prefill_snapshot_points(req) if start < p < start + n), None)
            if stop is not None:
                n = stop - start
        return n

    def _drafts(self, req: Request, n: int, room: int) -> tuple[list[int], bool]:
        """Draft tokens to verify after this step's `n` known tokens (see _most_drafts), and whether they
        come from the request's prediction."""
        most = self._most_drafts(req, n, room, self.config.most_prediction_drafts)
        if most <= 0:
            return [], False
        drafts = self.predictions.propose(req, most)
        predicted = bool(drafts)
        method_most = min(most, self.config.num_draft_tokens + 1 - n)  # the method's: k a step
        if not predicted and method_most > 0:
            drafts = self.proposer.propose(req, method_most)
        # drafts the grammar refuses would only be verified and rejected: cut them here
        if drafts and req.grammar is not None:
            drafts = drafts[: req.grammar.valid_prefix(drafts)]
        return drafts, predicted

    def _most_drafts(self, req: Request, n: int, room: int, cap: int) -> int:
        """How many drafts may follow this step's `n` known tokens: none unless they reach the end of the
        request's tokens; within the step budget `room`, the tokens it may still emit, its context, and a
        step of at most 1 + `cap` tokens (the draft count, or a prediction's)."""
        end = req.num_computed_tokens + n
        if self.proposer is None or room <= 0 or end != req.num_tokens:
            return 0
        if req.sampling_params.mirostat and not req.sampling_params.greedy:
            return 0  # Mirostat's state advances one sampled token at a time: no drafts to verify
        if self.snapshots_enabled and end % self.block_size == 0:
            return 0  # this step may snapshot the state at `end`: it must not have run drafts
        capacity = self.block_pool.num_blocks * self.block_size
        limit = min(self.config.max_context, capacity) - req.num_tokens
        left = req.sampling_params.max_tokens - len(req.output_token_ids)
        # every step emits one token beyond the drafts it accepts; and a step runs at most 1 + cap tokens a
        # request (a hybrid model recomputing accepted tokens drafts fewer): with cap = k its shape has a
        # CUDA graph
        return min(room, limit - 1, left - 1, cap + 1 - n)

    def _pad_drafts(self, scheduled: list[ScheduledRequest], budget: int) -> None:
        """A decode step (every request samples after its known tokens, no prompt chunk) in which some
        request drafts and the query counts differ: pad the shorter requests' drafts, where their limits
        and spare pages allow, to the longest count (within what is left of the step's `budget`). Rewrites
        `scheduled` in place."""
        k = self.config.num_draft_tokens
        counts = {len(s.token_ids) for s in scheduled}
        decode = all(
            s.sample and not s.runs_prompt_chunk(self.config.most_prediction_drafts) for s in scheduled
        )
        if len(counts) < 2 or not decode or not any(s.draft_token_ids for s in scheduled):
            return
        target, added = max(counts), 0
        if target > k + 1:  # a prediction's long drafts: no graph holds the step, padding would only cost
            return
        for i, s in enumerate(scheduled):
            req = self.requests[s.request_id]
            drafted = len(s.draft_token_ids)
            most = self._most_drafts(req, s.num_known_tokens, budget - added + drafted, k) - drafted
            extra = min(target - len(s.token_ids), most)
            end = req.num_computed_tokens + s.num_known_tokens
            if extra <= 0 or not self._grow_spare(req, end + drafted + extra, end):
                continue
            self._grow_for_drafter(req, s.num_known_tokens + drafted + extra)
            padding = (s.token_ids[-1],) * extra
            scheduled[i] = s._replace(
                token_ids=[*s.token_ids, *padding],
                draft_token_ids=(*s.draft_token_ids, *padding),
                num_padding=extra,
            )
            added += extra

    def _prefill_snapshot_points(self, req: Request) -> list[int]:
        """Page-aligned positions inside the prompt where the recurrent state is snapshotted: every
        interval, and the points a conversation resumes from (_resume_points)."""
        interval = self.config.state_snapshot_interval
        points = set(range(interval, req.num_prompt_tokens, interval)) if interval else set()
        return sorted(points | self._resume_points(req))

    def _resume_points(self, req: Request) -> set[int]:
        """The prompt's points where a later prompt resumes: its end, the turn points (_turn_points) and
        the request's hints (its client's cache breakpoints), each at or before its page boundary."""
        prompt_end = self._prompt_end(req)
        if not prompt_end:
            return set()
        inside = (p for p in (*self._turn_points(req), *self._hint_points(req)) if 0 < p < prompt_end)
        return {prompt_end, *inside}

    def _prompt_end(self, req: Request) -> int:
        """The prompt's last page boundary: where its end's snapshot is saved."""
        return req.num_prompt_tokens // self.block_size * self.block_size

    def _head_end(self, req: Request) -> int:
        """Where the prompt's third turn starts: the head before it (the system turn with the tools, and the
        first message) is what other conversations may share (an agent's tool list, a document asked about
        again); the prompt's length when it has no third turn, -1 without a turn token."""
        self._turn_points(req)  # (one scan finds both)
        return req.head_end

    def _earlier_turn(self, req: Request, num_pages: int) -> str | None:
        """The earlier request that saved the snapshot `req` resumes from, after its first `num_pages` pages,
        when that is past the conversation's head (so `req` is a later turn of its conversation, or an edit
        of one); None otherwise (a shared head's, its own after a preemption, one not known). Without turns
        known, only a snapshot not held as shared counts."""
        at_page = req.block_hashes[num_pages - 1]
        owner = self.state_pool.owner_of(at_page)
        if owner is None or owner[0] == req.request_id:
            return None
        head = self._head_end(req)
        if owner[1] <= head or (head < 0 and self.state_pool.is_shared(at_page)):
            return None
        return owner[0]

    def _hint_points(self, req: Request) -> set[int]:
        """The request's snapshot hints, each at or before its page boundary."""
        return {p // self.block_size * self.block_size for p in req.snapshot_hints}

    def _shared_points(self, req: Request) -> set[int]:
        """The snapshot points other conversations will resume from (StatePool's shared snapshots, evicted
        last), page-floored: the request's hints (a tool list's end, cache breakpoints); without any, where
        its second turn starts (past a system prompt that an agent's hints show may be per-session)."""
        return self._hint_points(req) or set(self._turn_points(req)[:1])

    def _turn_points(self, req: Request) -> tuple[int, ...]:
        """Where the prompt's second turn starts (after the system prompt and tools, which a new
        conversation of the same agent shares) and the turn before its last one (the last message, which a
        client edits and sends again, follows it), each at or before its page boundary, the second turn's
        first; found once a request (with the head's end, _head_end); none without a turn token
        (SchedulerConfig.turn_token_id) or a second turn."""
        if req.turn_points is None:
            req.turn_points, req.head_end = (), -1
            if self.config.turn_token_id >= 0:
                starts = np.flatnonzero(np.asarray(req.prompt_token_ids) == self.config.turn_token_id)
                req.head_end = int(starts[2]) if len(starts) > 2 else req.num_prompt_tokens
                starts = starts[1:]  # (past the first turn's start)
                picked = {int(starts[0]), int(starts[-2])} if len(starts) >= 2 else set(starts.tolist())
                req.turn_points = tuple(sorted(p // self.block_size * self.block_size for p in picked))
        return req.turn_points

    def _lookup_prefix(self, req: Request) -> tuple[list[int], list[bytes], int | bytes, int]:
        """Cached pages to reuse for the request's leading tokens (on the GPU), the hashes of the host-tier
        pages that follow them, the snapshot to restore (its slot, -1 for none, or its prefix hash when the
        host tier holds it: taken back if the request is admitted), and the pages found in the KV cache
        (on a hybrid model, those past the last snapshot are computed again)."""
        if not self.block_pool.enable_prefix_caching or _needs_prompt_logprobs(req):
            return [], [], -1, 0
        hashes = self._block_hashes(req, (req.num_tokens - 1) // self.block_size)
        hits = self.block_pool.lookup(hashes)
        host = self.block_pool.lookup_host(hashes[len(hits) :])
        kv_pages = len(hits) + len(host)
        if self.state_pool is None:
            return hits, host, -1, kv_pages
        for k in range(kv_pages, 0, -1):
            slot = self.state_pool.find_snapshot(hashes[k - 1])
            if slot is None and self.state_pool.in_host(hashes[k - 1]):
                slot = hashes[k - 1]
            if slot is not None:
                return hits[:k], host[: max(0, k - len(hits))], slot, kv_pages
        return [], [], -1, kv_pages

    def _block_hashes(self, req: Request, num_blocks: int) -> list[bytes]:
        """The request's page hashes for its first `num_blocks` full pages (computed once, then extended)."""
        have = len(req.block_hashes)
        if num_blocks > have:
            bs = self.block_size
            parent = req.block_hashes[-1] if have else req.cache_root
            tokens = req.token_slice(have * bs, num_blocks * bs)
            salts = req.mm.block_salts(have, num_blocks - have, bs) if req.mm else None
            req.block_hashes.extend(hash_blocks(tokens, bs, parent, salts))
        return req.block_hashes[:num_blocks]

    def _scheduled(
        self,
        req: Request,
        n: int,
        restore: int,
        state_saves: list[tuple[int, int]],
        drafts: list[int] | tuple[int, ...] = (),
        predicted: bool = False,
    ) -> ScheduledRequest:
        start = req.num_computed_tokens
        end = start + n
        if self.snapshots_enabled and end % self.block_size == 0:
            self._plan_snapshot(req, end, state_saves)
        return ScheduledRequest(
            request_id=req.request_id,
            token_ids=req.token_slice(start, end) + list(drafts),
            start_pos=start,
            block_ids=req.block_ids,
            state_slot=req.state_slot,
            # a pooled request (embedding, rerank) ends with its prompt: no logits, no token
            sample=end == req.num_tokens and req.sampling_params.pooling is None,
            sampling_params=req.sampling_params,
            history=req.token_history() if req.sampling_params.needs_history else None,
            state_restore=restore,
            draft_token_ids=tuple(drafts),
            predicted=predicted,
            next_token_id=req.token_slice(end, end + 1)[0] if end < req.num_tokens else -1,
            mm=req.mm,
            grammar=req.grammar,
            banned_rows=banned_rows(req, drafts),
            prompt_logprob_targets=_prompt_logprob_targets(req, start, end),
            pool_row=_pool_row(req, start, end),
            in_prompt=start < req.num_prompt_tokens,
        )

    def _plan_snapshot(self, req: Request, end: int, state_saves: list[tuple[int, int]]) -> None:
        """After this step the request's state is at page-aligned `end`: save it where it is useful."""
        in_prompt = end in self._prefill_snapshot_points(req)
        if not in_prompt and end <= req.num_prompt_tokens:
            return
        prefix_hash = self._block_hashes(req, end // self.block_size)[-1]
        if not in_prompt and req.rolling_snapshot is not None:
            # a rolling snapshot of the request's last page: the newest only, in the older one's slot (which
            # an eviction would otherwise take from another snapshot, e.g. its prompt's end)
            self.state_pool.drop_snapshot(req.rolling_snapshot)
            req.rolling_snapshot = None
        # an interval point alone is where a conversation resumes only when a later prompt departs from it
        # there: not worth host memory once evicted
        resumes = not in_prompt or end in self._resume_points(req)
        slot = self.state_pool.new_snapshot(
            prefix_hash,
            shared=in_prompt and end in self._shared_points(req),
            keep_evicted=resumes,
            owner=(req.request_id, end),
        )
        if slot is None:
            return
        state_saves.append((req.state_slot, slot))
        if not in_prompt:
            req.rolling_snapshot = prefix_hash
        elif req.resumes_turn_of is not None and end == self._prompt_end(req):
            # the conversation's next turn has its own resume point: the turn before's go before the others
            # (past the head; without turns known, the shared ones kept: they may be a head)
            head = self._head_end(req)
            self.state_pool.supersede(req.resumes_turn_of, after=max(head, 0), keep_shared=head < 0)
            req.resumes_turn_of = None

    def _fits(self, req: Request, need: int, num_hit_pages: int, free: int) -> bool:
        """Whether a waiting request is admitted with `need` new pages for its first chunk, `free` pages being
        free: a page each running request stays free beside them (so the next page one of them fills does not
        preempt the newcomer at once), and a preempted request waits until all its known tokens fit (its
        recomputation would otherwise be preempted again midway, and again at each readmission)."""
        if req.admitted:
            need = max(need, self.block_pool.blocks_needed(req.num_tokens, num_hit_pages))
        return need + len(self.running) <= free

    def _grow(self, req: Request, num_tokens: int) -> bool:
        need = self.block_pool.blocks_needed(num_tokens, len(req.block_ids))
        if need > self.block_pool.num_free_blocks:
            return False
        req.block_ids.extend(self.block_pool.allocate(need))
        return True

    def _grow_spare(self, req: Request, num_tokens: int, sure_tokens: int) -> bool:
        """Pages for `num_tokens`, of which only `sure_tokens` are sure to be kept: pages for the guesses
        past them only while a page each other running request stays free, so guesses never cost another
        request its pages (a preemption)."""
        pool = self.block_pool
        need = pool.blocks_needed(num_tokens, len(req.block_ids))
        guessed = need - pool.blocks_needed(sure_tokens, len(req.block_ids))
        if guessed and pool.num_free_blocks - need < len(self.running) - 1:
            return False
        return self._grow(req, num_tokens)

    def _grow_for_drafter(self, req: Request, n: int) -> None:
        """spec mtp / draft: spare pages for the positions the drafter's chained drafts write after a step of
        n tokens (the step's last emitted token's and k - 2 more for the MTP head, k - 1 more for a draft
        model); the chain stops where pages end, and pages end at the context limit: no later step verifies a
        draft past it, and the decode graphs' block table is as wide as that limit's pages."""
        if self.config.spec in ("mtp", "draft"):
            end = req.num_computed_tokens + n
            chain_end = end + self.config.num_draft_tokens - (self.config.spec == "mtp")
            self._grow_spare(req, min(chain_end, self.config.max_context), end)

    def _release(self, req: Request) -> None:
        self.block_pool.free(req.block_ids)
        req.block_ids = []
        req.num_registered_blocks = 0
        if req.state_slot >= 0:
            self.state_pool.free(req.state_slot)
            req.state_slot = -1

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        if self.proposer is not None:
            self.proposer.forget(req.request_id)
        self.waiting.appendleft(req)
        self._preempted_ids.append(req.request_id)  # the runner drops what it computes again
        self.num_preemptions += 1

    def _expire_waiting(self) -> None:
        timeout = self.config.pending_timeout_ms
        if timeout is None or not self.waiting:
            return
        now = self.clock()
        for req in [r for r in self.waiting if not r.admitted]:
            if self._waits_for_prompt(req):  # held on purpose: its wait counts from its twin's prompt end
                req.arrival_time = now
                continue
            waited_ms = (now - req.arrival_time) * 1000.0
            if waited_ms > timeout:
                req.error = (
                    f"inference request expired while waiting for admission after {waited_ms:.0f} ms; "
                    "raise --pending-timeout-ms or lower --max-concurrency"
                )
                self.finish_request(req.request_id, "expired")
                self.expired.append(req)

    # -- results -------------------------------------------------------------------------------
    def update_from_output(self, sched: SchedulerOutput, out: RunnerOutput) -> list[tuple[Request, int]]:
        """Advance requests by what ran; append the tokens they emitted, up to one that finishes them.
        Returns each request that got tokens, with how many."""
        updated = []
        for s in sched.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status != RequestStatus.RUNNING:
                continue  # aborted during the step
            if s.prompt_logprob_targets:  # in order: a recomputed chunk (after preemption) overwrites
                del req.prompt_logprobs[s.start_pos :]
                req.prompt_logprobs.extend(out.prompt_logprobs[s.request_id])
            if s.pool_row >= 0:
                req.embedding = out.embeddings[s.request_id]
            emitted = out.sampled.get(s.request_id) or []
            drafted, accepted = len(s.draft_token_ids), max(len(emitted) - 1, 0)
            # the counters leave padding out (a padded draft accepted counts as one of them)
            proposed = drafted - s.num_padding
            self.num_draft_tokens += proposed
            self.num_accepted_tokens += min(accepted, proposed)
            self.num_drafts += proposed > 0
            req.num_draft_tokens += proposed
            req.num_accepted_tokens += min(accepted, proposed)
            if s.predicted:
                req.num_prediction_tokens += proposed
                req.num_accepted_prediction_tokens += min(accepted, proposed)
            # the cache holds the known tokens and the accepted drafts, unless a hybrid state went back
            if not (s.state_slot >= 0 and accepted < drafted):
                req.num_computed_tokens += s.num_known_tokens + accepted
            n, reason = 0, None
            while reason is None and n < len(emitted):
                sampled = emitted[n]
                req.output_token_ids.append(sampled.token_id)
                if sampled.logprobs is not None:
                    req.output_logprobs.append(sampled.logprobs)
                n += 1
                reason = self._stop_reason(req, sampled.token_id)
            if req.grammar is not None and n:
                req.grammar.consume([t.token_id for t in emitted[:n]])
                if reason is None and req.grammar.done:  # complete: nothing but the end may follow
                    if req.grammar.error:
                        log.warning("request %s left its grammar: %s", req.request_id, req.grammar.error)
                    reason = "stop"
            # a stop among accepted drafts leaves computed tokens past the end
            req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens)
            self._register_full_blocks(req)  # after the tokens it covers are appended
            if s.pool_row >= 0:  # pooled: it ends with its prompt, "length" as when it sampled its one token
                reason = "length"
            if reason is not None:
                self.finish_request(req.request_id, reason)
            if n or s.pool_row >= 0:
                updated.append((req, n))
            drafts = out.drafts.get(s.request_id)
            if drafts is not None and reason is None:
                self.proposer.store(req.request_id, req.num_tokens, drafts)
        return updated

    def drop_output_tokens(self, req: Request, n: int) -> None:
        """Take back the last `n` output tokens (emitted past a stop string in the same step)."""
        if n <= 0:
            return
        del req.output_token_ids[-n:]
        del req.output_logprobs[len(req.output_token_ids) :]
        req.num_computed_tokens = min(req.num_computed_tokens, req.num_tokens)

    def _register_full_blocks(self, req: Request) -> None:
        """Name the pages that now hold a full page of computed tokens in the prefix cache."""
        num_full = req.num_computed_tokens // self.block_size
        if num_full <= req.num_registered_blocks or not self.block_pool.enable_prefix_caching:
            return
        hashes = self._block_hashes(req, num_full)
        for i in range(req.num_registered_blocks, num_full):
            self.block_pool.register(req.block_ids[i], hashes[i])
        req.num_registered_blocks = num_full

    def _stop_reason(self, req: Request, token_id: int) -> str | None:
        params = req.sampling_params
        if not params.ignore_eos and token_id in req.eos_token_ids:
            return "stop"
        if token_id in params.stop_token_ids:
            return "stop"
        capacity = self.block_pool.num_blocks * self.block_size
        if len(req.output_token_ids) >= params.max_tokens or req.num_tokens >= min(
            self.config.max_context, capacity
        ):
            return "length"
        return None

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (GPU pool, host tier, state snapshots); running requests go on with
        their pages. Between steps only."""
        self.block_pool.reset_prefix_cache()
        if self.state_pool is not None:
            self.state_pool.clear_snapshots()

    def step_failed(self, sched: SchedulerOutput) -> None:
        """The step `sched` raised before its end: the requests finished before it are forgotten by the
        runner at the next step, and the prefix cache is forgotten when the step was to fill some of it
        (pages copied to or from the host tier, state snapshots), as those may be half-written."""
        self._finished_ids[:0] = sched.finished_request_ids
        self._preempted_ids[:0] = sched.preempted_request_ids
        if (
            sched.swap_out
            or sched.swap_in
            or sched.state_saves
            or sched.state_swap_out
            or sched.state_swap_in
        ):
            self.reset_prefix_cache()
            log.warning("the prefix cache was forgotten: the failed step was filling some of it")

    def finish_request(self, request_id: str, reason: str) -> None:
        """Finish (or abort) a request: its pages and state slot are freed at once."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        if self.reuse is not None and req.mm is None and reason != "error":  # its named pages, a source
            n = req.num_registered_blocks
            self.reuse.remember(req.cache_root, req.token_slice(0, n * self.block_size), req.block_hashes[:n])
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.remove(req)
        self._release(req)
        if self.proposer is not None:
            self.predictions.forget(request_id)
            self.proposer.forget(request_id)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self._finished_ids.append(request_id)


def _needs_prompt_logprobs(req: Request) -> bool:
    """Whether the request still needs prompt positions computed for their log-probabilities (so takes
    no prefix-cache hit)."""
    return (
        req.sampling_params.prompt_logprobs is not None
        and len(req.prompt_logprobs) < req.num_prompt_tokens - 1
    )


def _pool_row(req: Request, start: int, end: int) -> int:
    """Pooling: the row of a step running start..end that holds the prompt's last token; -1 if none."""
    last = req.num_prompt_tokens - 1
    return last - start if req.sampling_params.pooling is not None and start <= last < end else -1


def _prompt_logprob_targets(req: Request, start: int, end: int) -> tuple[int, ...]:
    """The prompt tokens that positions start.. of a step running start..end predict (prompt_logprobs)."""
    if req.sampling_params.prompt_logprobs is None:
        return ()
    last = min(end, req.num_prompt_tokens - 1)  # the last prompt position predicts the first output token
    return tuple(req.prompt_token_ids[start + 1 : last + 1]) if last > start else ()
