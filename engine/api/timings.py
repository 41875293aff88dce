"""llama-server's `timings` object: how long a request's prompt and its reply took, and at what rate; on its
native routes' final object and, as llama-server adds it, on OpenAI chat completions (the reply, or a
stream's finishing chunk), where its web UI and scripts read the speed and the context used
(cache_n + prompt_n + predicted_n); and `prompt_progress` between a long prompt's chunks
(return_progress)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from engine.api.common import field
from engine.request import RequestOutput, SamplingParams


def with_progress(params: SamplingParams, body: dict) -> SamplingParams:
    """The params with return_progress when a streamed request asks for it (a reply that is not streamed has
    no use for it); for the routes that send `prompt_progress`."""
    if field(body, "return_progress", bool, False) and field(body, "stream", bool, False):
        return replace(params, return_progress=True)
    return params


class Clock:
    """When a request began, and when its first and its latest tokens came (time.perf_counter)."""

    def __init__(self, began: float | None = None):
        self.began = time.perf_counter() if began is None else began
        self.first: float | None = None
        self.last: float | None = None

    def token(self, out: RequestOutput) -> None:
        """Note an output of the request (one with no tokens yet, an empty one, changes nothing)."""
        if out.token_ids:
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now

    def timings(self, out: RequestOutput, prompt_tokens: int | None = None) -> dict[str, Any]:
        """`timings` for the request's output; `prompt_tokens`: the prompt as run (images widened), else the
        output's. The prompt's time runs to the first token, the reply's from it to the last."""
        now = time.perf_counter()
        first, last = self.first or now, self.last or now
        cache_n = out.num_cached_tokens
        prompt_n = (len(out.prompt_token_ids) if prompt_tokens is None else prompt_tokens) - cache_n
        predicted_n = len(out.token_ids)
        prompt_ms, predicted_ms = (first - self.began) * 1000, (last - first) * 1000
        timings = {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n * 1000 / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            # the first token came with the prompt: the rate is of the ones after it
            "predicted_per_second": (predicted_n - 1) * 1000 / predicted_ms if predicted_ms > 0 else 0.0,
        }
        if out.num_draft_tokens:  # speculative decoding: the draft tokens verified, and of those accepted
            timings.update(draft_n=out.num_draft_tokens, draft_n_accepted=out.num_accepted_tokens)
        return timings

    def progress(self, out: RequestOutput) -> dict[str, Any]:
        """llama-server's `prompt_progress` for an output between prompt chunks (return_progress): the
        prompt's tokens, those cached at admission, those in the cache now (the cached ones too), and the
        milliseconds since the request began."""
        total, cache, processed = out.prompt_progress
        return {
            "total": total,
            "cache": cache,
            "processed": processed,
            "time_ms": (time.perf_counter() - self.began) * 1000,
        }
