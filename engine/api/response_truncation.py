"""The Responses API's `truncation: "auto"`: a conversation longer than the context drops its earliest items.

Items go by whole exchanges (a user message and what followed it up to the next one: calls, their outputs
and replies), so no call is left without its output or an output without its call; the instructions and the
last exchange always stay (if those alone are too long, the request is refused as any too-long prompt is).
The fewest exchanges are dropped: a binary search over where the kept part starts, each try rendered by the
chat template and counted in tokens. What is stored for previous_response_id is the whole conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Rendered = tuple[Any, str, list[int]]  # (images, prompt text, token ids)


def fit_by_dropping_turns(
    turns: list[dict[str, Any]], first: Rendered, render: Callable[[int], Rendered], limit: int
) -> Rendered:
    """The prompt of `turns` without its earliest exchanges, as few as leave at most `limit` tokens; `first`
    is render(0), `render(cut)` the prompt without the first `cut` turns."""
    if len(first[2]) <= limit:
        return first
    starts = [i for i, turn in enumerate(turns) if turn.get("role") == "user" and i > 0]
    if not starts:
        return first
    lo, hi = 0, len(starts) - 1  # the answer's index in starts: the first cut that fits (else the last)
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        rendered = render(starts[mid])
        if len(rendered[2]) <= limit:
            best, hi = rendered, mid - 1
        else:
            lo = mid + 1
    return best if best is not None else render(starts[-1])
