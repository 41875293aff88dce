"""The contract between the scheduler and the model runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from engine.request import PromptLogprob, SamplingParams, TokenHistory

if TYPE_CHECKING:
    from engine.structured.matcher import GrammarMatcher
    from engine.vision.mrope import MultiModalInputs


class ScheduledRequest(NamedTuple):
    request_id: str
    # the tokens to run this step: a prefill chunk, or the last sampled token; then draft_token_ids
    token_ids: list[int]
    start_pos: int  # position of token_ids[0] == tokens of this request already in the cache
    block_ids: list[int]  # KV pages of the request, enough for start_pos + len(token_ids) tokens
    state_slot: int  # recurrent-state slot, -1 when the model has none
    sample: bool  # True when this step reaches the end of the known tokens, so a new token is sampled
    sampling_params: SamplingParams
    # the request's tokens when its penalties or DRY read them; None otherwise
    history: TokenHistory | None = None
    state_restore: int = -1  # snapshot slot to copy into state_slot before running (a prefix-cache hit)
    # speculative decoding: guesses of the tokens after the known ones, run at the end of token_ids and
    # verified (only with sample=True). A hybrid model's state returns to start_pos unless all are accepted
    draft_token_ids: tuple[int, ...] = ()
    next_token_id: int = -1  # the token after token_ids when the request has it (a prompt chunk's next)
    # of draft_token_ids, the last ones that only pad the request to the step's common query count (CUDA
    # graphs: Scheduler._pad_drafts); verified like any draft, left out of the acceptance counters
    num_padding: int = 0
    predicted: bool = False  # the drafts come from the request's prediction (engine/spec/prediction.py)
    mm: MultiModalInputs | None = None  # the request's images and 3D positions (engine/vision)
    grammar: GrammarMatcher | None = None  # structured outputs: masks the sampled rows (sample=True)
    # per sampled row (the next token, then one per draft; fewer rows than that: the rest ban nothing), the
    # token ids it may not be: the request's EOS and stop token ids before min_tokens, and the last token of
    # each of vLLM's bad_words the tokens before the row would complete (engine/scheduler/bans.py)
    banned_rows: tuple[tuple[int, ...], ...] = ()
    # prompt_logprobs: the first len(...) of token_ids are prompt positions whose next prompt token is this
    prompt_logprob_targets: tuple[int, ...] = ()
    # pooling: the row of token_ids that is the prompt's last token, whose hidden state is the embedding
    pool_row: int = -1
    in_prompt: bool = False  # token_ids start inside the request's prompt

    @property
    def num_known_tokens(self) -> int:
        """Tokens of the request's history run this step (token_ids without the drafts)."""
        return len(self.token_ids) - len(self.draft_token_ids)

    def runs_prompt_chunk(self, most_drafts: int) -> bool:
        """A chunk of the prompt, or more known tokens than a decoding request runs (its last one, or a
        hybrid model's accepted drafts recomputed before it: at most 1 + most_drafts; more is a preempted
        request's tokens computed again)."""
        return self.in_prompt or self.num_known_tokens > 1 + most_drafts


class SchedulerOutput(NamedTuple):
    scheduled: list[ScheduledRequest]
    finished_request_ids: list[str]  # finished or aborted since the last step (runner drops their state)
    state_saves: list[tuple[int, int]] = []  # (state slot, snapshot slot) to copy after the forward
    # the host tier (engine/cache/host_pool.py), copied before the forward, swap_out first:
    swap_out: list[tuple[int, int]] = []  # (KV page, host slot): evicted pages whose prefix stays findable
    swap_in: list[tuple[int, int]] = []  # (host slot, KV page): host pages a request takes back
    # --cache-reuse, copied after the host tier's: (source slot, destination slot, shift) per token, the key
    # rotated by the shift (engine/cache/kv_shift.py)
    kv_shifts: list[tuple[int, int, int]] = []
    # preempted since the last step: the runner drops what it can compute again (their images' embeddings)
    # and keeps their sampling state (their seeds, Mirostat's surprise target)
    preempted_request_ids: list[str] = []
    # a hybrid model's snapshots in the host tier (engine/cache/state_pool.py), copied before the forward
    # and the restores, out first: (snapshot slot, host slot) evicted, (host slot, snapshot slot) taken back
    state_swap_out: list[tuple[int, int]] = []
    state_swap_in: list[tuple[int, int]] = []

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {r.request_id: len(r.token_ids) for r in self.scheduled}


class SampledToken(NamedTuple):
    token_id: int
    logprobs: dict[int, float] | None  # chosen token + top-N, when asked for
    accepted: bool = False  # the row verified a draft token and kept it (token_id is the draft)


class RunnerOutput(NamedTuple):
    # only for requests scheduled with sample=True: the tokens emitted, in order; one plus the number of
    # draft tokens accepted
    sampled: dict[str, list[SampledToken]]
    # spec mtp: draft tokens for each request that emitted tokens, to follow its last one
    drafts: dict[str, list[int]] = {}
    # prompt_logprobs: for each request with prompt_logprob_targets, one PromptLogprob per target
    prompt_logprobs: dict[str, list[PromptLogprob]] = {}
    # pooling: for each request with a pool_row, its hidden state there (fp32)
    embeddings: dict[str, list[float]] = {}
