"""Prometheus metrics of one server (its own registry): ninfer's, and vLLM's and llama-server's names beside
them (engine/api/metrics_compat.py)."""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from engine.api.metrics_compat import LlamaCppMetrics, RequestTimes, VllmMetrics
from engine.request import RequestOutput

_log = logging.getLogger("ninfer.requests")


class Metrics:
    def __init__(self, engine, model_name: str = "ninfer"):
        self.engine = engine
        self.registry = r = CollectorRegistry()
        self.running = Gauge("ninfer_requests_running", "Requests running in the engine", registry=r)
        self.waiting = Gauge("ninfer_requests_waiting", "Requests waiting for admission", registry=r)
        self.kv_used = Gauge("ninfer_kv_pages_used", "KV cache pages in use", registry=r)
        self.kv_total = Gauge("ninfer_kv_pages_total", "KV cache pages in all", registry=r)
        self.prompt_tokens = Counter("ninfer_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("ninfer_generation_tokens", "Tokens generated", registry=r)
        self.cached_tokens = Counter(
            "ninfer_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache", registry=r
        )
        self.spec_drafted = Counter(
            "ninfer_spec_draft_tokens", "Speculative draft tokens verified (finished requests)", registry=r
        )
        self.spec_accepted = Counter(
            "ninfer_spec_accepted_tokens", "Speculative draft tokens accepted (finished requests)", registry=r
        )
        self.spec_acceptance = Gauge(
            "ninfer_spec_acceptance_rate",
            "Accepted / drafted tokens since start (0 without drafts)",
            registry=r,
        )
        self.host_used = Gauge(
            "ninfer_host_cache_pages_used", "KV pages held in the host tier (--host-cache)", registry=r
        )
        self.host_total = Gauge("ninfer_host_cache_pages_total", "KV pages the host tier holds", registry=r)
        self.host_hits = Gauge(
            "ninfer_prefix_cache_host_hit_tokens",
            "Prompt tokens copied back from the host tier instead of computed (since start)",
            registry=r,
        )
        self.snapshots_used = Gauge(
            "ninfer_state_snapshots_used",
            "Recurrent-state snapshots held for the prefix cache (hybrid models; --state-snapshots)",
            registry=r,
        )
        self.snapshots_total = Gauge(
            "ninfer_state_snapshots_total", "Recurrent-state snapshot slots (hybrid models)", registry=r
        )
        self.snapshots_shared = Gauge(
            "ninfer_state_snapshots_shared",
            "Of the snapshots held, those of prefixes other conversations resume from (a tool list's end, a "
            "system prompt's, a cache_control mark's), evicted last",
            registry=r,
        )
        self.host_snapshots_used = Gauge(
            "ninfer_host_state_snapshots_used",
            "Recurrent-state snapshots evicted from the GPU slots and held in host memory (hybrid models; "
            "--host-state-snapshots)",
            registry=r,
        )
        self.host_snapshots_total = Gauge(
            "ninfer_host_state_snapshots_total",
            "State snapshots the host tier holds (hybrid models)",
            registry=r,
        )
        self.state_lost = Gauge(
            "ninfer_prefix_cache_state_lost_tokens",
            "Prompt tokens whose KV pages were cached but computed again, no recurrent-state snapshot being at "
            "or past them (hybrid models, since start): many suggest raising --state-snapshots",
            registry=r,
        )
        self.sleep_level = Gauge(
            "ninfer_sleep_level",
            "0 while awake; 1 or 2 while asleep (POST /sleep, --sleep-idle-seconds): the device memory given back",
            registry=r,
        )
        self.preemptions = Gauge(
            "ninfer_preemptions",
            "Requests preempted since start (their KV freed for others, their tokens computed again later)",
            registry=r,
        )
        # what the slow-decode triage asks first: the KV precision and pool really in use, graphs on or off
        Info("ninfer_engine", "How the engine runs (as allocated, not as asked)", registry=r).info(
            engine.info()
        )
        self.images = Counter("ninfer_images", "Images in requests (--vision)", registry=r)
        self.image_tokens = Counter("ninfer_image_tokens", "Prompt tokens the images take", registry=r)
        self.requests = Counter("ninfer_requests_finished", "Finished requests", ["reason"], registry=r)
        self.lora_requests = Counter(
            "ninfer_lora_requests",
            "Requests run with a LoRA adapter (each adapter of a mix)",
            ["adapter"],
            registry=r,
        )
        self.structured = Counter(
            "ninfer_structured_requests",
            "Requests held to a grammar (response_format, structured_outputs, forced or strict tool calls)",
            registry=r,
        )
        self.ttft = Histogram(
            "ninfer_time_to_first_token_seconds",
            "Time to first token",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.queue = Histogram(
            "ninfer_request_queue_time_seconds",
            "Time a request waited for admission (the queue's share of its time to first token)",
            registry=r,
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600),
        )
        self.itl = Histogram(
            "ninfer_inter_token_latency_seconds",
            "Time between streamed tokens",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )
        self._stats: dict | None = None  # the engine's stats while a scrape is rendered
        self.vllm = VllmMetrics(r, engine, model_name, self.scrape_stats)
        self.llama_cpp = LlamaCppMetrics(r, engine, engine.llm.engine_config.block_size, self.scrape_stats)
        self._last: dict[str, float] = {}
        self._start: dict[str, float] = {}
        self._first: dict[str, float] = {}
        self._images: dict[str, tuple[int, int]] = {}  # request -> (images, their tokens)
        self._adapters: dict[str, str] = {}  # request -> its LoRA adapters, as the log line names them

    def started(
        self,
        request_id: str,
        images: list | None = None,
        structured: bool = False,
        adapters: tuple[tuple[str, float], ...] = (),
        max_tokens: int | None = None,
    ) -> None:
        self._start[request_id] = time.monotonic()
        if max_tokens is not None:
            self.vllm.started(max_tokens)
        if structured:
            self.structured.inc()
        if adapters:
            for name, _ in adapters:
                self.lora_requests.labels(name).inc()
            self._adapters[request_id] = "+".join(n if s == 1.0 else f"{s:g}x{n}" for n, s in adapters)
        if images:
            tokens = sum(image.num_tokens for image in images)
            self._images[request_id] = (len(images), tokens)
            self.images.inc(len(images))
            self.image_tokens.inc(tokens)

    def token(self, out: RequestOutput) -> None:
        now = time.monotonic()
        last = self._last.get(out.request_id)
        if last is None:
            start = self._start.get(out.request_id)
            self._first[out.request_id] = now
            if start is not None:
                self.ttft.observe(now - start)
                self.vllm.token(True, now - start)
        else:
            self.itl.observe(now - last)
            self.vllm.token(False, now - last)
        self._last[out.request_id] = now

    def finished(self, out: RequestOutput | None) -> None:
        """Count a finished request and log its one line: id, tokens, cache hit, TTFT, decode rate."""
        if out is None:
            return
        times = RequestTimes(
            self._start.pop(out.request_id, None),
            self._first.pop(out.request_id, None),
            self._last.pop(out.request_id, None),
            time.monotonic(),
        )
        ttft = f"{times.ttft * 1000:.0f} ms" if times.ttft is not None else "-"
        n = len(out.token_ids)
        rate = f"{(n - 1) / times.decode:.1f} tok/s" if n > 1 and times.decode else "-"
        spec = f" accepted={out.num_accepted_tokens}/{out.num_draft_tokens}" if out.num_draft_tokens else ""
        images = self._images.pop(out.request_id, None)
        spec += f" images={images[0]} ({images[1]} tokens)" if images else ""
        adapters = self._adapters.pop(out.request_id, None)
        spec += f" lora={adapters}" if adapters else ""
        queued = f" (queued {out.queue_time * 1000:.0f} ms)" if out.queue_time else ""
        _log.info(
            "%s prompt=%d cached=%d generated=%d ttft=%s%s decode=%s finish=%s%s",
            out.request_id,
            len(out.prompt_token_ids),
            out.num_cached_tokens,
            n,
            ttft,
            queued,
            rate,
            out.finish_reason,
            spec,
        )
        if out.queue_time is not None:
            self.queue.observe(out.queue_time)

        self.prompt_tokens.inc(len(out.prompt_token_ids))
        # an embedding's one sampled token is beside the point: no generation
        generated = 0 if out.embedding is not None else n
        self.generation_tokens.inc(generated)
        self.vllm.finished(out, generated, times)
        self.llama_cpp.finished(out, generated, times)
        self.cached_tokens.inc(out.num_cached_tokens)
        self.spec_drafted.inc(out.num_draft_tokens)
        self.spec_accepted.inc(out.num_accepted_tokens)
        self.requests.labels(out.finish_reason or "unknown").inc()

    def scrape_stats(self) -> dict:
        """The engine's stats: read once a scrape, for every name set; outside one (a collector registered),
        read now."""
        return self._stats if self._stats is not None else self.engine.stats()

    def render(self) -> bytes:
        self._stats = stats = self.engine.stats()
        try:
            return self._render(stats)
        finally:
            self._stats = None

    def _render(self, stats: dict) -> bytes:
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_total.set(stats["kv_blocks_total"])
        self.kv_used.set(stats["kv_blocks_total"] - stats["kv_blocks_free"])
        self.host_used.set(stats.get("host_cache_pages_used", 0))
        self.host_total.set(stats.get("host_cache_pages_total", 0))
        self.host_hits.set(stats.get("prefix_cache_host_hits", 0))
        self.preemptions.set(stats["num_preemptions"])
        self.snapshots_used.set(stats.get("state_snapshots_used", 0))
        self.snapshots_total.set(stats.get("state_snapshots_total", 0))
        self.snapshots_shared.set(stats.get("state_snapshots_shared", 0))
        self.host_snapshots_used.set(stats.get("host_state_snapshots_used", 0))
        self.host_snapshots_total.set(stats.get("host_state_snapshots_total", 0))
        self.state_lost.set(stats.get("prefix_cache_state_lost_tokens", 0))
        self.sleep_level.set(stats["sleep_level"])
        drafted = stats["spec_draft_tokens"]
        self.spec_acceptance.set(stats["spec_accepted_tokens"] / drafted if drafted else 0.0)
        return generate_latest(self.registry)
