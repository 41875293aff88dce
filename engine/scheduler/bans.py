"""What each sampled row of a step may not be: the request's end before min_tokens (its EOS and stop token
ids), and the last token of each of vLLM's bad_words at a row whose preceding tokens (the output so far,
then the step's drafts before the row) are the rest of that word."""

from __future__ import annotations

from collections.abc import Sequence

from engine.request import Request


def banned_rows(req: Request, drafts: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """One tuple of banned token ids per sampled row (the next token, then one per draft); () when no row
    bans anything."""
    params = req.sampling_params
    left = params.min_tokens - len(req.output_token_ids)  # rows that may not end the output
    ends = set(params.stop_token_ids) | (set() if params.ignore_eos else set(req.eos_token_ids))
    words = req.bad_word_ids
    if not words and (left <= 0 or not ends):
        return ()
    longest = max((len(w) for w in words), default=1)
    out = req.output_token_ids
    before = list(out[max(0, len(out) - longest + 1) :]) if longest > 1 else []
    rows = []
    for k in range(len(drafts) + 1):
        tail = before + list(drafts[:k])  # the tokens before row k (the last longest - 1 of them suffice)
        ban = set(ends) if k < left else set()
        ban.update(w[-1] for w in words if len(w) == 1 or tail[len(tail) - len(w) + 1 :] == list(w[:-1]))
        rows.append(tuple(sorted(ban)))
    return tuple(rows)
