"""DRY ("don't repeat yourself"), llama.cpp's sampler against verbatim loops: a penalty on each token that
would extend a run of tokens the context already holds.

The context ends with its last token L. At every earlier occurrence of L, followed there by token t, the
run is how many tokens before L match the tokens before that occurrence (L itself counts one). Sampling t
next would repeat that run plus t; with n its longest such run over all occurrences, t's logit loses
`dry_multiplier * dry_base ** (n - dry_allowed_length)` once n >= dry_allowed_length. A run does not
reach back across a sequence breaker (a token whose text holds one of dry_sequence_breakers: a new line, a
colon, ...; or a place inside a breaker that tokenizes to several tokens, a name in pieces), a breaker after
an occurrence is never penalized, and a breaker as the last token stops DRY for the step.

Host-side numpy over the request's window (SamplingParams.dry_penalty_last_n tokens; -1: the whole
context): the occurrences are found in one comparison, and the runs grow backwards together, one token a
round, until none matches.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from engine.errors import NinferError
from engine.request import SamplingParams

MAX_RUN = 64  # a longer run counts as this long (dry_base ** 62 is a ban already)
MAX_PENALTY = 1e9  # penalties beyond this are this: a banned token stays finite for the softmax


class DryBreakers(NamedTuple):
    """A request's sequence breakers: the tokens whose text holds one, and the token sequences of those that
    tokenize to several tokens (a name split in pieces), which break where they occur in the context."""

    mask: np.ndarray  # [V] bool
    sequences: tuple[np.ndarray, ...] = ()  # each [L >= 2] int64

    def at(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[len(positions)] bool: the positions of `tokens` that are breakers (a breaking token, or inside
        an occurrence of a breaking sequence)."""
        flags = self.mask[tokens[positions]]
        n = len(tokens)
        for seq in self.sequences:
            size = len(seq)
            for j in range(size):  # the position as the sequence's j-th token: an occurrence from p - j
                start = positions - j
                match = (start >= 0) & (start + size <= n)
                for i in range(size):
                    match &= tokens[np.clip(start + i, 0, n - 1)] == seq[i]
                flags |= match
        return flags


def dry_penalties(
    tokens: np.ndarray,  # [N] int64, DRY's window: the context's last tokens
    breakers: DryBreakers | None,  # None: no breakers
    params: SamplingParams,
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids [K] int64, penalties [K] float64) for the token after `tokens`; both empty when none."""
    none = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    n = len(tokens)
    if n < 2:
        return none
    # the breakers among the context's last MAX_RUN + 1 tokens: the runs read no further back
    low = max(0, n - 1 - MAX_RUN)
    tail = breakers.at(tokens, np.arange(low, n)) if breakers is not None else np.zeros(n - low, dtype=bool)
    if tail[-1]:
        return none
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # earlier occurrences of the last token
    if breakers is not None:
        ends = ends[~breakers.at(tokens, ends + 1)]
    if not len(ends):
        return none
    runs = np.ones(len(ends), dtype=np.int64)
    alive = np.arange(len(ends))  # occurrences whose run still grows
    for k in range(1, MAX_RUN):
        at = n - 1 - k  # the context's token k before its last (n - 1 > live ends >= k - 1)
        if tail[at - low]:
            break
        starts = ends[alive] - k
        alive = alive[starts >= 0]
        alive = alive[tokens[ends[alive] - k] == tokens[at]]
        if not len(alive):
            break
        runs[alive] += 1
    followers, which = np.unique(tokens[ends + 1], return_inverse=True)
    longest = np.zeros(len(followers), dtype=np.int64)
    np.maximum.at(longest, which, runs)
    hit = longest >= params.dry_allowed_length
    with np.errstate(over="ignore"):
        penalties = params.dry_multiplier * params.dry_base ** (longest[hit] - params.dry_allowed_length)
    return followers[hit], np.minimum(penalties, MAX_PENALTY)


def breaker_mask(vocab_bytes: Sequence[bytes], vocab_size: int, breakers: tuple[str, ...]) -> np.ndarray:
    """[vocab_size] bool: the tokens whose bytes (`vocab_bytes`, by id) hold one of `breakers`. Searched in
    the vocabulary joined by NUL bytes (one pass a breaker), each match's token found by its offset."""
    tokens = vocab_bytes[:vocab_size]
    mask = np.zeros(vocab_size, dtype=bool)
    joined = b"\0".join(tokens)
    starts = np.cumsum([0, *(len(t) + 1 for t in tokens[:-1])])  # [V] where each token begins
    for needle in {b.encode() for b in breakers}:
        if b"\0" in needle:  # (a match could join two tokens) token by token
            mask[[i for i, token in enumerate(tokens) if needle in token]] = True
            continue
        at = [m.start() for m in re.finditer(re.escape(needle), joined)]
        mask[np.searchsorted(starts, np.asarray(at, dtype=np.int64), side="right") - 1] = True
    return mask


class BreakerMasks:
    """Each request's DryBreakers, by its dry_sequence_breakers (a few sets kept: clients send the same)."""

    KEPT = 8

    def __init__(self, tokenizer, vocab_size: int, model: str):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.model = model
        self._masks: dict[tuple[str, ...], DryBreakers] = {}

    def __call__(self, params: SamplingParams) -> DryBreakers | None:
        """None without DRY or without breakers."""
        breakers = params.dry_sequence_breakers
        if not params.uses_dry or not breakers:
            return None
        found = self._masks.get(breakers)
        if found is None:
            if self.tokenizer is None:
                raise NinferError(
                    f"{self.model} has no tokenizer to find DRY's sequence breakers in; pass "
                    "dry_sequence_breakers=[]"
                )
            if len(self._masks) >= self.KEPT:
                self._masks.pop(next(iter(self._masks)))
            mask = breaker_mask(self.tokenizer.vocab_bytes, self.vocab_size, breakers)
            found = self._masks[breakers] = DryBreakers(mask, self._split(breakers, mask))
        return found

    def _split(self, breakers: tuple[str, ...], mask: np.ndarray) -> tuple[np.ndarray, ...]:
        """The token sequences of the breakers that tokenize to several tokens none of which holds the
        breaker whole, as text starts with them and after a space."""
        out = {}
        for text in breakers:
            for variant in (text, " " + text.lstrip()):
                ids = self.tokenizer.encode(variant, add_special_tokens=False)
                if len(ids) >= 2 and not mask[ids].any():
                    out[tuple(ids)] = np.asarray(ids, dtype=np.int64)
        return tuple(out.values())
