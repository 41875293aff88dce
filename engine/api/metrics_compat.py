"""vLLM's and llama-server's metric names on /metrics beside ninfer's own: a Grafana dashboard, a router that
picks a replica by its queue and KV use (vllm:num_requests_waiting, vllm:kv_cache_usage_perc), or a script
written against `vllm serve` or `llama-server --metrics` reads this server unchanged.

vLLM's carry its labels (model_name: the served model id; engine: "0"); llama-server's carry none. What
ninfer does not measure is left out rather than made up: llama.cpp's decode-call counts. vLLM's prefill
time is the time to first token less the queue time, its inference time the request's whole time less
the queue time. llama.cpp's prompt seconds are the time to the first token (the queue included), its
tokens per second the averages of those totals.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.request import RequestOutput

LABELS = ("model_name", "engine")
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560)
TOKEN_GAPS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.8, 1.6, 5, 20)
TOKENS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))  # 1 .. 500,000


class RequestTimes(NamedTuple):
    """One finished request's times (time.monotonic): started, first token, last token, finished."""

    start: float | None
    first: float | None
    last: float | None
    end: float

    @property
    def ttft(self) -> float | None:
        return self.first - self.start if self.first is not None and self.start is not None else None

    @property
    def decode(self) -> float | None:
        return self.last - self.first if self.first is not None and self.last is not None else None


class VllmMetrics:
    """vllm:* — gauges and cumulative counters read from the engine at each scrape, histograms and request
    counters fed by the server's request hooks."""

    def __init__(self, registry: CollectorRegistry, engine, model_name: str, stats: Callable[[], dict]):
        """stats: the engine's stats of the scrape under way (read once a scrape: Metrics.scrape_stats)."""
        self.engine, self.stats = engine, stats
        self.values = (model_name, "0")

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, LABELS, registry=registry, buckets=buckets).labels(*self.values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=registry).labels(*self.values)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token", SECONDS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between output tokens", TOKEN_GAPS)
        # vLLM's older name for the same gaps, which its dashboards still chart
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Time between output tokens", TOKEN_GAPS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Request start to its last output", SECONDS)
        self.decode = histogram(
            "vllm:request_decode_time_seconds", "First output token to the last, per request", SECONDS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Arrival to admission, per request", SECONDS
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds", "Admission to the first output token, per request", SECONDS
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds", "Admission to the last output, per request", SECONDS
        )
        self.prompt_len = histogram("vllm:request_prompt_tokens", "Prompt tokens per request", TOKENS)
        self.output_len = histogram("vllm:request_generation_tokens", "Generated tokens per request", TOKENS)
        self.max_tokens = histogram("vllm:request_params_max_tokens", "max_tokens asked per request", TOKENS)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated")
        self.success = Counter(
            "vllm:request_success", "Finished requests", (*LABELS, "finished_reason"), registry=registry
        )
        registry.register(self)

    def started(self, max_tokens: int) -> None:
        self.max_tokens.observe(max_tokens)

    def token(self, first: bool, gap: float) -> None:
        if first:
            self.ttft.observe(gap)
        else:
            self.itl.observe(gap)
            self.tpot.observe(gap)

    def finished(self, out: RequestOutput, generated: int, times: RequestTimes) -> None:
        if times.start is not None:
            self.e2e.observe(times.end - times.start)
        if times.decode is not None:
            self.decode.observe(times.decode)
        if out.queue_time is not None:
            self.queue.observe(out.queue_time)
            if times.ttft is not None:
                self.prefill.observe(max(0.0, times.ttft - out.queue_time))
            if times.start is not None:
                self.inference.observe(max(0.0, times.end - times.start - out.queue_time))
        self.prompt_len.observe(len(out.prompt_token_ids))
        self.output_len.observe(generated)
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        self.generation_tokens.inc(generated)
        self.success.labels(*self.values, out.finish_reason or "abort").inc()

    def collect(self):
        stats = self.stats()
        total, free = stats["kv_blocks_total"], stats["kv_blocks_free"]
        usage = (total - free) / total if total else 0.0
        values = list(self.values)
        gauges = {
            "vllm:num_requests_running": ("Requests running in the engine", stats["num_running"]),
            "vllm:num_requests_waiting": ("Requests waiting for admission", stats["num_waiting"]),
            "vllm:kv_cache_usage_perc": ("KV cache pages in use, 1 = all", usage),
            "vllm:gpu_cache_usage_perc": ("KV cache pages in use, 1 = all (vLLM's older name)", usage),
        }
        for name, (doc, value) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            family.add_metric(values, value)
            yield family
        counters = {
            "vllm:num_preemptions": ("Requests preempted", stats["num_preemptions"]),
            "vllm:prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache",
                stats["prefix_cache_queries"],
            ),
            "vllm:prefix_cache_hits": ("Prompt tokens found in the prefix cache", stats["prefix_cache_hits"]),
            "vllm:spec_decode_num_draft_tokens": ("Draft tokens verified", stats["spec_draft_tokens"]),
            "vllm:spec_decode_num_accepted_tokens": ("Draft tokens accepted", stats["spec_accepted_tokens"]),
            "vllm:spec_decode_num_drafts": (
                "Verifications (a request's drafts of a step)",
                stats["spec_drafts"],
            ),
        }
        for name, (doc, value) in counters.items():
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(values, value)
            yield family
        steps = self.engine.step_tokens()
        family = HistogramMetricFamily(
            "vllm:iteration_tokens_total", "Tokens run per engine step", labels=LABELS
        )
        family.add_metric(values, steps.cumulative(), sum_value=steps.sum)
        yield family
        yield from self._info(stats)

    def _info(self, stats: dict):
        """vllm:cache_config_info (the KV pool's shape) and vllm:lora_requests_info (the adapters running and
        waiting, as a router with LoRA affinity reads them; its value the time, as vLLM's)."""
        llm = self.engine.llm
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "The KV cache's configuration",
            labels=("block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks", "engine"),
        )
        config = llm.engine_config
        cache.add_metric(
            [
                str(config.block_size),
                self.engine.info().get("kv_dtype", "none"),
                str(config.enable_prefix_caching),
                str(stats["kv_blocks_total"]),
                "0",
            ],
            1.0,
        )
        yield cache
        running, waiting = self.engine.adapters_in_use()
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "The LoRA adapters of the running and the waiting requests",
            labels=("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
        )
        lora.add_metric([str(len(llm.adapters.slots)), ",".join(waiting), ",".join(running)], time.time())
        yield lora


class LlamaCppMetrics:
    """llamacpp:* — llama-server's --metrics names."""

    def __init__(self, registry: CollectorRegistry, engine, block_size: int, stats: Callable[[], dict]):
        self.engine, self.stats = engine, stats
        self.block_size = block_size
        self.prompt_tokens = 0  # computed (not found in the cache), of finished requests
        self.prompt_seconds = 0.0
        self.predicted_tokens = 0
        self.predicted_seconds = 0.0
        registry.register(self)

    def finished(self, out: RequestOutput, generated: int, times: RequestTimes) -> None:
        self.prompt_tokens += len(out.prompt_token_ids) - out.num_cached_tokens
        self.prompt_seconds += times.ttft or 0.0
        self.predicted_tokens += generated
        self.predicted_seconds += times.decode or 0.0

    def collect(self):
        stats = self.stats()
        used = stats["kv_blocks_total"] - stats["kv_blocks_free"]
        counters = {
            "llamacpp:prompt_tokens": ("Prompt tokens computed", self.prompt_tokens),
            "llamacpp:prompt_seconds": ("Time to the first token, summed", self.prompt_seconds),
            "llamacpp:tokens_predicted": ("Tokens generated", self.predicted_tokens),
            "llamacpp:tokens_predicted_seconds": ("First token to the last, summed", self.predicted_seconds),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        gauges = {
            "llamacpp:prompt_tokens_seconds": (
                "Prompt tokens per second, on average",
                self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0,
            ),
            "llamacpp:predicted_tokens_seconds": (
                "Generated tokens per second, on average",
                self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else 0.0,
            ),
            "llamacpp:kv_cache_usage_ratio": (
                "KV cache pages in use, 1 = all",
                used / stats["kv_blocks_total"] if stats["kv_blocks_total"] else 0.0,
            ),
            "llamacpp:kv_cache_tokens": ("Tokens the KV pages in use hold, at most", used * self.block_size),
            "llamacpp:requests_processing": ("Requests running", stats["num_running"]),
            "llamacpp:requests_deferred": ("Requests waiting for admission", stats["num_waiting"]),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
