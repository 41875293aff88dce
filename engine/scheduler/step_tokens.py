"""The tokens each engine step ran, as a histogram (vLLM's vllm:iteration_tokens_total): bucket counts kept
as plain ints by the engine thread, read by a /metrics scrape without locking."""

from __future__ import annotations

from bisect import bisect_left

BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class StepTokens:
    def __init__(self, buckets: tuple[int, ...] = BUCKETS):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # steps per bucket; the last: past the largest
        self.sum = 0

    def observe(self, num_tokens: int) -> None:
        self.counts[bisect_left(self.buckets, num_tokens)] += 1
        self.sum += num_tokens

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, steps at or below it) per bucket, "+Inf" last: Prometheus' histogram buckets."""
        out, total = [], 0
        for bound, count in zip([*(str(float(b)) for b in self.buckets), "+Inf"], list(self.counts)):
            total += count
            out.append((bound, total))
        return out
