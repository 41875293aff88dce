"""N-gram drafts (prompt lookup): propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens.

Coding and agent traffic repeats itself (a file echoed back with an edit, tool-call JSON, names from the
prompt), so the continuation of an earlier match is often the continuation now. Drafts cost no model run:
one vectorised scan of the token history per step (numpy, ~0.1 ms at 180K tokens). The verifier decides
what is kept, so a poor draft costs only the compute of its positions.
"""

from __future__ import annotations

import numpy as np

from engine.request import Request


class NgramProposer:
    """Per request, its token history in a growing int32 buffer, and draft proposals from it."""

    def __init__(self, num_draft_tokens: int, max_ngram: int = 4, min_ngram: int = 2):
        assert num_draft_tokens > 0 and 0 < min_ngram <= max_ngram
        self.num_draft_tokens, self.max_ngram, self.min_ngram = num_draft_tokens, max_ngram, min_ngram
        self._buffers: dict[str, tuple[np.ndarray, int]] = {}  # request id -> (buffer, tokens in it)

    def forget(self, request_id: str) -> None:
        self._buffers.pop(request_id, None)

    def _history(self, req: Request) -> np.ndarray:
        """The request's tokens as an int32 array, appending only what is new since the last call."""
        buf, n = self._buffers.get(req.request_id, (np.empty(0, np.int32), 0))
        total = req.num_tokens
        if total < n:  # the history was cut (a stop string dropped tokens): start again
            n = 0
        if total > len(buf):
            grown = np.empty(max(total + 256, 2 * len(buf)), np.int32)
            grown[:n] = buf[:n]
            buf = grown
        buf[n:total] = req.token_slice(n, total)
        self._buffers[req.request_id] = (buf, total)
        return buf[:total]

    def propose(self, req: Request, max_tokens: int) -> list[int]:
        """Up to min(num_draft_tokens, max_tokens) tokens to verify after the request's tokens; [] when its
        last `min_ngram` tokens never occurred before."""
        k = min(self.num_draft_tokens, max_tokens)
        tokens = self._history(req)
        n = len(tokens)
        if k <= 0 or n <= self.min_ngram:
            return []
        # candidate ends: earlier positions holding the last token (the last position itself excluded)
        ends = np.flatnonzero(tokens[: n - 1] == tokens[n - 1])
        best, length = None, 1
        while len(ends) and length < self.max_ngram:
            # keep the ends whose match also extends one more token back
            ends = ends[ends >= length]
            ends = ends[tokens[ends - length] == tokens[n - 1 - length]]
            length += 1
            if len(ends) and length >= self.min_ngram:
                best = int(ends[-1])  # the latest earlier occurrence of the longest suffix matched
        if best is None:
            return []
        return tokens[best + 1 : best + 1 + k].tolist()
