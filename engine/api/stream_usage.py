"""OpenAI's `stream_options` on streamed chat and text completions: `include_usage` (a usage chunk, with no
choices, before `[DONE]`; every other chunk carries `"usage": null`) and vLLM's `continuous_usage_stats`
(with include_usage: every chunk carries the usage so far)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.api.common import field
from engine.api.errors import ApiError
from engine.request import RequestOutput


@dataclass(frozen=True)
class StreamUsage:
    include: bool = False
    continuous: bool = False
    prompt_tokens: int = 0  # every prompt counted once, whatever its number of choices

    def add_to(self, payload: dict[str, Any], latest: list[RequestOutput | None]) -> dict[str, Any]:
        """A chunk's "usage": left out without include_usage; null before the totals; with continuous
        stats, the usage so far (the completion tokens of every choice's latest output)."""
        if not self.include:
            return payload
        payload["usage"] = None
        if self.continuous:
            completion = sum(len(o.token_ids) for o in latest if o is not None)
            payload["usage"] = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
            }
        return payload


def stream_usage(body: dict, stream: bool, prompts: list[list[int]]) -> StreamUsage:
    """The body's stream_options, checked (they go with "stream": true only, as OpenAI and vLLM have it)."""
    options = field(body, "stream_options", dict)
    if options is None:
        return StreamUsage()
    if not stream:
        raise ApiError(400, "'stream_options' goes with \"stream\": true", "stream_options")
    include = field(options, "include_usage", bool, False)
    continuous = field(options, "continuous_usage_stats", bool, False)
    return StreamUsage(include, include and continuous, sum(len(ids) for ids in prompts))
