"""Request state shared by the scheduler, the runner and the offline / server front ends."""

from __future__ import annotations

import enum
import functools
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from engine.errors import NinferError

if TYPE_CHECKING:
    from engine.sample.dry import DryBreakers
    from engine.structured.matcher import GrammarMatcher
    from engine.vision.mrope import MultiModalInputs


POOLING = (None, "last")


# llama.cpp's sampling fields beside vLLM's, named as its server takes them: SamplingParams field -> kind
LLAMA_CPP_FIELDS: dict[str, type] = {
    "repeat_last_n": int,
    "dynatemp_range": float,
    "dynatemp_exponent": float,
    "typical_p": float,
    "top_n_sigma": float,
    "xtc_probability": float,
    "xtc_threshold": float,
    "dry_multiplier": float,
    "dry_base": float,
    "dry_allowed_length": int,
    "dry_penalty_last_n": int,
    "dry_sequence_breakers": list,
    "mirostat": int,
    "mirostat_tau": float,
    "mirostat_eta": float,
}
# SamplingParams' numeric fields: checked for their kind before their range
_WHOLE_NUMBERS = (
    "max_tokens",
    "min_tokens",
    "top_k",
    "seed",
    "logprobs",
    "prompt_logprobs",
    "thinking_budget",
    *(name for name, kind in LLAMA_CPP_FIELDS.items() if kind is int),
)
_FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    *(name for name, kind in LLAMA_CPP_FIELDS.items() if kind is float),
)
_NUMBERS = (*_WHOLE_NUMBERS, *_FLOATS)
_OPTIONAL = ("seed", "logprobs", "prompt_logprobs", "thinking_budget", "repeat_last_n")
# llama.cpp's default DRY sequence breakers: a repeat is not followed across a new line, a colon, a quote or
# an asterisk (a chat's "Name:" headers, dialogue and emphasis)
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. temperature == 0 is greedy; logprobs=N also returns the top-N per token."""

    max_tokens: int = 256
    # neither an EOS token nor a stop_token_id can be sampled, nor a stop string end the output, before this
    # many tokens (vLLM's min_tokens)
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # drop tokens less likely than min_p x the top token's probability
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and the output (logit / p or * p)
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    # llama.cpp's repeat_last_n: the three penalties above count the last N tokens of prompt and output
    # together (-1: the whole context; 0: the penalties are off); None: as vLLM counts (the repetition
    # penalty over prompt and output, presence and frequency over the output)
    repeat_last_n: int | None = None
    # llama.cpp's samplers beside vLLM's (engine/sample/filters.py, engine/sample/dry.py); each off at its
    # default. Dynamic temperature: a sampled row's temperature is temperature -/+ dynatemp_range, higher
    # as its distribution is flatter: (entropy / the most it could be) ** dynatemp_exponent of the way up
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    # Locally typical sampling: the tokens whose surprise is nearest the distribution's entropy,
    # up to this much probability
    typical_p: float = 1.0
    top_n_sigma: float = -1.0  # keep the logits within N standard deviations of the top one; <= 0: off
    # XTC (exclude top choices): with this chance at each token, every token at least xtc_threshold likely
    # is dropped but the least likely of them (when two or more are)
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    # DRY (don't repeat yourself): a token that would extend a repeat of n >= dry_allowed_length tokens
    # already in the last dry_penalty_last_n tokens (-1: the whole context, 0: off) loses
    # dry_multiplier * dry_base ** (n - dry_allowed_length) from its logit; a repeat does not reach back
    # across one of dry_sequence_breakers (a token holding it, or its tokens where it takes several)
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] | list[str] = DRY_SEQUENCE_BREAKERS
    # Mirostat 1 or 2 (0: off): instead of the truncations above, the kept tokens are steered so that the
    # sampled tokens' surprise (-log2 p) averages mirostat_tau bits, learning at rate mirostat_eta; a request
    # with it drafts nothing (its steering state advances one sampled token at a time)
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int | None = None
    stop: tuple[str, ...] | list[str] | str | None = None
    # vLLM's include_stop_str_in_output: the text ends with the stop string that ended it (else before it)
    include_stop_str_in_output: bool = False
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    # log-probabilities of the prompt's tokens (each given those before it) and the top-N there; the prompt
    # is computed whole for them (no prefix-cache hit)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # structured outputs: the grammar the output must follow, as engine/structured/grammars.py builds it
    # (a JSON schema, a regex, a choice, forced tool calls; or llguidance Lark text)
    grammar: str | None = None
    # with the prompt inside an open <think> (thinking on): at most this many reasoning tokens, then </think>
    thinking_budget: int | None = None
    # added to the logits of those token ids before sampling, -100..100 (-100 bans, 100 all but forces);
    # a {token_id: bias} dict is taken too
    logit_bias: tuple[tuple[int, float], ...] | dict[int, float] | None = None
    # vLLM's allowed_token_ids: every sampled token is one of these (EOS only when listed); None: any
    allowed_token_ids: tuple[int, ...] | list[int] | None = None
    # vLLM's bad_words: the output never holds one of these words' tokens; the last token of a word is banned
    # wherever the tokens before it would complete the word (at the start of the text or after a space)
    bad_words: tuple[str, ...] | list[str] = ()
    # "last": the output carries an embedding, the final-normed hidden state at the prompt's last token (as
    # Qwen3-Embedding pools); the tokens the request generates are beside the point
    pooling: str | None = None
    # OpenAI's Predicted Outputs: the tokens the output is expected to be (a file being edited), drafted
    # where the output follows them when speculative decoding is on (engine/spec/prediction.py)
    prediction: tuple[int, ...] | list[int] = ()
    # the LoRA adapter the request runs with, by its served name (engine/lora); None: the base model
    adapter: str | None = None
    # llama.cpp's weighted mix instead: {name: scale} (or pairs), each adapter's delta times its scale, summed;
    # a scale of 0 leaves the adapter out
    adapter_scales: tuple[tuple[str, float], ...] | dict[str, float] = ()
    # llama-server's return_progress: while the prompt runs in chunks, an output after each chunk that ran
    # without a token (no tokens, `prompt_progress` set), so a client can show how far its prompt has come
    return_progress: bool = False

    def __post_init__(self):
        for name in _NUMBERS:  # the API's callers get a sentence, not a comparison's TypeError
            value = getattr(self, name)
            whole = name in _WHOLE_NUMBERS
            optional = name in _OPTIONAL
            if (value is None and optional) or (
                isinstance(value, int if whole else (int, float)) and not isinstance(value, bool)
            ):
                continue
            kind = "a whole number" if whole else "a number"
            raise NinferError(f"{name} must be {kind}{' or None' if optional else ''} (got {value!r})")
        for name in _WHOLE_NUMBERS:  # tensors and torch's generator hold 64 bits (a seed: signed or not)
            value = getattr(self, name)
            if value is not None and not -(2**63) <= value < 2 ** (64 if name == "seed" else 63):
                raise NinferError(f"{name} must fit in 64 bits (got {value})")
        if not all(math.isfinite(getattr(self, name)) for name in _FLOATS):
            raise NinferError("sampling parameters must be finite numbers (got NaN or infinity)")
        if self.max_tokens < 1:
            raise NinferError(f"max_tokens must be at least 1 (got {self.max_tokens})")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise NinferError(
                f"min_tokens must be between 0 and max_tokens ({self.max_tokens}) (got {self.min_tokens})"
            )
        if self.min_tokens and self.grammar is not None:
            raise NinferError(
                "min_tokens does not go with structured outputs or forced tool calls: the grammar decides "
                "where the output ends; drop min_tokens"
            )
        if self.temperature < 0:
            raise NinferError(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise NinferError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise NinferError(f"top_k must be >= 0, 0 meaning off (got {self.top_k})")
        if not 0 <= self.min_p <= 1:
            raise NinferError(f"min_p must be in [0, 1] (got {self.min_p})")
        if self.repetition_penalty <= 0:
            raise NinferError(
                f"repetition_penalty must be > 0, 1 meaning off (got {self.repetition_penalty})"
            )
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            raise NinferError("presence_penalty and frequency_penalty must be between -2 and 2")
        self._check_llama_cpp_samplers()
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise NinferError(f"thinking_budget must be >= 0 tokens (got {self.thinking_budget})")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise NinferError(f"logprobs must be between 0 and 20 (got {self.logprobs})")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise NinferError(f"prompt_logprobs must be between 0 and 20 (got {self.prompt_logprobs})")
        if self.allowed_token_ids is not None:
            allowed = tuple(self.allowed_token_ids)
            if not allowed or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in allowed):
                raise NinferError("allowed_token_ids must be a non-empty list of token ids (integers >= 0)")
            object.__setattr__(self, "allowed_token_ids", allowed)
        words = (self.bad_words,) if isinstance(self.bad_words, str) else tuple(self.bad_words)
        if any(not isinstance(w, str) or not w.strip() for w in words):
            raise NinferError("bad_words must be a list of non-empty strings")
        object.__setattr__(self, "bad_words", words)
        prediction = tuple(self.prediction or ())
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in prediction):
            raise NinferError("prediction must be a list of token ids (integers >= 0)")
        object.__setattr__(self, "prediction", prediction)
        if self.adapter is not None and not (isinstance(self.adapter, str) and self.adapter):
            raise NinferError(f"adapter is a LoRA adapter's name or None (got {self.adapter!r})")
        object.__setattr__(self, "adapter_scales", _adapter_scales(self.adapter_scales))
        if self.adapter is not None and self.adapter_scales:
            raise NinferError("name one LoRA adapter (adapter) or a mix of them (adapter_scales), not both")
        if self.pooling not in POOLING:
            raise NinferError(f"pooling must be one of {', '.join(map(str, POOLING))} (got {self.pooling!r})")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop or ()
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise NinferError(f"stop is a string or a list of strings (got {self.stop!r})")
        object.__setattr__(self, "stop", tuple(s for s in stop if s))
        stop_ids = tuple(self.stop_token_ids or ())
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in stop_ids):
            raise NinferError(
                f"stop_token_ids is a list of token ids, integers >= 0 (got {self.stop_token_ids!r})"
            )
        object.__setattr__(self, "stop_token_ids", stop_ids)
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias or ()
        bias = tuple((int(t), float(b)) for t, b in bias)
        bad = next(((t, b) for t, b in bias if t < 0 or not -100 <= b <= 100 or not math.isfinite(b)), None)
        if bad is not None:
            raise NinferError(
                f"logit_bias maps token ids (>= 0) to biases between -100 and 100 (got {bad[0]}: {bad[1]})"
            )
        object.__setattr__(self, "logit_bias", bias)

    def _check_llama_cpp_samplers(self) -> None:
        """The ranges of llama.cpp's samplers; a sampler left off is not checked further (clients send
        every field with its default)."""
        if self.repeat_last_n is not None and self.repeat_last_n < -1:
            raise NinferError(
                f"repeat_last_n must be -1 (the whole context), 0 (penalties off) or more (got {self.repeat_last_n})"
            )
        if not 0 < self.typical_p <= 1:
            raise NinferError(f"typical_p must be in (0, 1], 1 meaning off (got {self.typical_p})")
        if not 0 <= self.xtc_probability <= 1:
            raise NinferError(
                f"xtc_probability must be in [0, 1], 0 meaning off (got {self.xtc_probability})"
            )
        if self.xtc_probability > 0 and not 0 <= self.xtc_threshold <= 1:
            raise NinferError(f"xtc_threshold must be in [0, 1] (got {self.xtc_threshold})")
        if self.dry_multiplier < 0:
            raise NinferError(f"dry_multiplier must be >= 0, 0 meaning off (got {self.dry_multiplier})")
        if self.dry_penalty_last_n < -1:
            raise NinferError(
                "dry_penalty_last_n must be -1 (the whole context), 0 (DRY off) or more "
                f"(got {self.dry_penalty_last_n})"
            )
        breakers = self.dry_sequence_breakers
        breakers = (breakers,) if isinstance(breakers, str) else breakers
        if not isinstance(breakers, (list, tuple)) or any(not isinstance(b, str) or not b for b in breakers):
            raise NinferError(f"dry_sequence_breakers is a list of non-empty strings (got {breakers!r})")
        object.__setattr__(self, "dry_sequence_breakers", tuple(breakers))
        if self.uses_dry and self.dry_base < 1:
            raise NinferError(f"dry_base must be >= 1 (got {self.dry_base}); llama.cpp's default is 1.75")
        if self.mirostat not in (0, 1, 2):
            raise NinferError(f"mirostat must be 0 (off), 1 or 2 (got {self.mirostat})")
        if self.mirostat and (self.mirostat_tau <= 0 or self.mirostat_eta <= 0):
            raise NinferError(
                f"mirostat_tau and mirostat_eta must be > 0 (got {self.mirostat_tau}, {self.mirostat_eta}); "
                "llama.cpp's defaults are 5.0 and 0.1"
            )
        if self.uses_dry and self.dry_allowed_length < 1:
            raise NinferError(f"dry_allowed_length must be >= 1 token (got {self.dry_allowed_length})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_dry(self) -> bool:
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0

    @property
    def needs_history(self) -> bool:
        """The sampler reads the request's tokens (penalties, DRY)."""
        return self.has_penalties or self.uses_dry

    @property
    def adapter_mix(self) -> tuple[tuple[str, float], ...]:
        """(name, scale) of each LoRA adapter the request runs with (none: the base model)."""
        if self.adapter is not None:
            return ((self.adapter, 1.0),)
        return tuple((name, scale) for name, scale in self.adapter_scales if scale != 0.0)

    @property
    def has_penalties(self) -> bool:
        if self.repeat_last_n == 0:
            return False
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _adapter_scales(value) -> tuple[tuple[str, float], ...]:
    pairs = tuple(value.items() if isinstance(value, dict) else value or ())
    out = []
    for pair in pairs:
        name, scale = pair if isinstance(pair, (tuple, list)) and len(pair) == 2 else (None, None)
        number = isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale)
        if not (isinstance(name, str) and name) or not number:
            raise NinferError(f"adapter_scales maps LoRA adapter names to finite scales (got {pair!r})")
        out.append((name, float(scale)))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise NinferError(f"adapter_scales names an adapter twice ({', '.join(names)})")
    return tuple(sorted(out))


class PromptLogprob(NamedTuple):
    """A prompt token's log-probability given the tokens before it: {the token: logprob, then the top-N},
    and the token's rank (1 = the most likely)."""

    logprobs: dict[int, float]
    rank: int


class TokenHistory(NamedTuple):
    """What the sampler's penalties and DRY read of a request: its tokens, and DRY's sequence breakers."""

    prompt: np.ndarray  # [P] int64, the prompt's tokens
    prompt_unique: np.ndarray  # [U] int64, the prompt's distinct tokens (the repetition penalty's)
    output_ids: list[int]  # the tokens generated so far (with a draft row's drafts before it)
    dry_breakers: DryBreakers | None = None  # DRY's sequence breakers (engine/sample/dry.py); None: none

    def tail(self, n: int) -> np.ndarray:
        """The last n tokens of prompt and output together (-1: all), [n] int64."""
        output = self.output_ids
        if n < 0:
            return np.concatenate((self.prompt, np.asarray(output, dtype=np.int64)))
        out = np.asarray(output[len(output) - min(n, len(output)) :], dtype=np.int64)
        need = min(n - len(out), len(self.prompt))
        return np.concatenate((self.prompt[len(self.prompt) - need :], out)) if need > 0 else out


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    # per generated token: {token_id: logprob} holding the chosen token and the top-N
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    block_ids: list[int] = field(default_factory=list)
    state_slot: int = -1  # recurrent-state slot (hybrid models); -1 when none
    arrival_time: float = field(default_factory=time.monotonic)
    admitted: bool = False  # once admitted, a request never expires (preempted ones wait again)
    admitted_at: float | None = None  # the scheduler's clock (time.monotonic) at its first admission
    num_cached_tokens: int = -1  # prompt tokens found in the prefix cache at first admission
    block_hashes: list[bytes] = field(default_factory=list)  # hash chain of the full pages of all_token_ids
    cache_root: bytes = b""  # the chain's root: the base model's, or its LoRA adapter's (engine/lora)
    num_registered_blocks: int = 0  # leading block_ids already named in the prefix cache
    rolling_snapshot: bytes | None = None  # prefix hash of this request's last-page state snapshot
    # the earlier request of this conversation from whose snapshot (past the conversation's head) this one
    # resumed: its own prompt end's snapshot supersedes that request's (engine/cache/state_pool.py)
    resumes_turn_of: str | None = None
    # page-aligned starts of its prompt's second turn and of the turn before its last (Scheduler._turn_points)
    turn_points: tuple[int, ...] | None = None
    # where its prompt's third turn starts (the head before it: the system turn and the first message); the
    # prompt's length without one, -1 without a turn token (Scheduler._head_end, found with turn_points)
    head_end: int = -1
    # prompt positions where a client expects to send the prefix again (its cache breakpoints;
    # LLM.add_request): snapshotted too, at or before the page boundary
    snapshot_hints: tuple[int, ...] = ()
    error: str | None = None  # why the request ended without finishing (expired, a failed step)
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified for this request
    num_accepted_tokens: int = 0  # of those, accepted
    num_prediction_tokens: int = 0  # of the drafts, those from the prediction (SamplingParams.prediction)
    num_accepted_prediction_tokens: int = 0  # of those, accepted
    mm: MultiModalInputs | None = None  # the prompt's images and 3D positions (engine/vision)
    grammar: GrammarMatcher | None = None  # structured outputs: the output's grammar state
    # prompt_logprobs: entry p is prompt token p + 1's, given tokens 0..p (filled as prompt chunks run)
    prompt_logprobs: list[PromptLogprob] = field(default_factory=list)
    # pooling: the prompt's pooled hidden state, once its last token has run
    embedding: list[float] | None = None
    # another request with the same prompt (n > 1 choices): this one is not admitted while that one runs
    # its prompt, so it starts from that prompt's pages in the prefix cache instead of computing them too
    after: str | None = None
    # vLLM's bad_words as token ids (each word as the text starts with it and after a space)
    bad_word_ids: tuple[tuple[int, ...], ...] = ()
    # DRY's sequence breakers, SamplingParams.dry_sequence_breakers found in the vocabulary (engine/sample/dry.py);
    # None: no breakers
    dry_breakers: DryBreakers | None = None

    @functools.cached_property
    def _prompt_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        prompt = np.asarray(self.prompt_token_ids, dtype=np.int64)
        return prompt, np.unique(prompt)

    def token_history(self) -> TokenHistory:
        """The request's tokens for the sampler's penalties and DRY (the prompt's arrays built once)."""
        return TokenHistory(*self._prompt_arrays, self.output_token_ids, self.dry_breakers)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole history (a step's tokens at 180K context)."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED


@dataclass
class RequestOutput:
    """What the offline API returns for one request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None  # stop, length, abort, expired, error (a failed step)
    num_cached_tokens: int = 0
    error: str | None = None  # why it ended without its reply (expired; a failed step: finish_reason error)
    stop_string: str | None = None  # the stop string that ended the request, if one did
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified, and of those accepted
    num_accepted_tokens: int = 0
    # of the drafts, those from the request's prediction (SamplingParams.prediction), and of those accepted
    num_prediction_tokens: int = 0
    num_accepted_prediction_tokens: int = 0
    # prompt_logprobs: one per prompt token, None for the first (nothing before it to predict it from)
    prompt_logprobs: list[PromptLogprob | None] | None = None
    # pooling: the prompt's embedding (not normalized), once the prompt has run
    embedding: list[float] | None = None
    queue_time: float | None = None  # seconds from arrival to first admission (None: not admitted)
    # return_progress: an output between prompt chunks (no new tokens) carries (prompt tokens, of those
    # cached at admission, of those in the cache now)
    prompt_progress: tuple[int, int, int] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
