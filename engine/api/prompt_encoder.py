"""Encoding a rendered prompt that repeats a recent one: an agent resends its whole conversation every turn,
so a prompt's text starts with the last one's, and encoding all of it again (half a second at 290K tokens
with a byte-level BPE tokenizer) would cost each turn more the longer it grows.

The tokenizer splits a text at its added tokens before anything else reads it, and encodes the pieces apart;
so where two texts agree up to and through a special token (`<|im_start|>`: ChatML's turn start), the tokens
before it are the same in both, and the new text's are the old one's up to there and the encoding of the
rest. Which special token is the last inside the shared text is read off the old tokens' byte lengths. Only
for tokenizers whose tokens' bytes add up to the text (byte-level BPE: Qwen's, Llama 3's, SmolLM2's) and
boundaries that take no whitespace beside them (no lstrip / rstrip / single_word, not normalized); others
encode whole, as does a prompt that shares less than MIN_SHARED characters with the recent ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine.api.snapshot_hints import shared_prefix
from engine.tokenizer import Tokenizer

CAPACITY = 8  # the latest prompts kept (several agents, or an agent and its subagents, alternate)
MIN_SHARED = 4096  # characters: a shorter shared head is encoded again (nothing to save)


@dataclass(frozen=True)
class _Encoded:
    text: str
    ids: np.ndarray  # [n] int32
    ends: np.ndarray  # [n] int64: each token's end in the text's UTF-8 bytes
    boundaries: np.ndarray  # indices into ids of the special tokens the text splits at


class PromptEncoder:
    """`encode(text)`: the tokenizer's ids of `text` (no special tokens added), reusing a recent prompt's."""

    def __init__(self, tokenizer: Tokenizer, capacity: int = CAPACITY):
        self.tokenizer, self.capacity = tokenizer, capacity
        self._recent: OrderedDict[str, _Encoded] = OrderedDict()  # by text, the latest last
        self._lock = threading.Lock()  # (the routes render in worker threads)
        added = tokenizer.backend.get_added_tokens_decoder()
        splits = [
            i
            for i, t in added.items()
            if t.special and not (t.lstrip or t.rstrip or t.single_word or t.normalized)
        ]
        self._splits = np.zeros(tokenizer.vocab_size, dtype=bool)
        self._splits[[i for i in splits if i < tokenizer.vocab_size]] = True
        self.reused = 0  # tokens taken from a recent prompt rather than encoded (for tests and benchmarks)
        # the tokenizer adds no special tokens of its own (a BOS, an EOS): a raw prompt's ids are its text's
        self.adds_nothing = all(tokenizer.encode(t, True) == tokenizer.encode(t, False) for t in ("", "a b"))

    def encode(self, text: str) -> list[int]:
        raw = text.encode("utf-8")
        head = self._reusable(text)
        prefix, rest = ([], text) if head is None else (head[0], raw[head[1] :].decode("utf-8"))
        ids = [*prefix, *self.tokenizer.encode(rest, add_special_tokens=False)]
        encoded = self._encoded(text, raw, ids)
        if encoded is not None:
            with self._lock:
                self.reused += len(prefix)
                self._recent.pop(text, None)
                self._recent[text] = encoded
                while len(self._recent) > self.capacity:
                    self._recent.popitem(last=False)
        return ids

    def _reusable(self, text: str) -> tuple[list[int], int] | None:
        """The recent prompt's tokens before the last special token the two texts share whole, and where
        that token starts in `text`'s bytes; None where none helps."""
        with self._lock:
            recent = list(self._recent.values())
        best, shared = None, MIN_SHARED - 1
        for entry in reversed(recent):  # the latest first
            if text.startswith(entry.text):  # the last turn's prompt whole (an agent's next turn)
                n = len(entry.text)
            elif text[:64] != entry.text[:64]:  # another conversation
                continue
            else:
                n = shared_prefix(text, entry.text)
            if n > shared:
                best, shared = entry, n
        if best is None:
            return None
        shared_bytes = len(text[:shared].encode("utf-8"))
        # the special tokens wholly inside the shared text; the last one is where the new encoding starts
        inside = best.boundaries[best.ends[best.boundaries] <= shared_bytes]
        if len(inside) == 0:
            return None
        k = int(inside[-1])
        return best.ids[:k].tolist(), int(best.ends[k - 1]) if k else 0

    def _encoded(self, text: str, raw: bytes, ids: list[int]) -> _Encoded | None:
        """The entry kept for a later prompt; None where the tokens' bytes do not add up to the text (not a
        byte-level tokenizer, or a boundary that ate whitespace): such a text is not reused."""
        array = np.asarray(ids, dtype=np.int32)
        if len(array) == 0 or int(array.max()) >= len(self._splits):
            return None
        ends = np.cumsum(self.tokenizer.token_lengths[array])
        if int(ends[-1]) != len(raw):
            return None
        return _Encoded(text, array, ends, np.flatnonzero(self._splits[array]))
