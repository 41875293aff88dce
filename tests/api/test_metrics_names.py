"""/metrics under vLLM's and llama-server's names beside ninfer's (engine/api/metrics_compat.py), on the
embedded model: what two requests of one prompt leave there, streamed and not, parsed as Prometheus does."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server import RunningServer

from engine.async_llm import AsyncLLM

PROMPT = "Write one line about the sea. " * 6  # more than two 16-token pages: the second request hits them
GEN = 5


@pytest.fixture(scope="module")
def scraped():
    with RunningServer(AsyncLLM(max_concurrency=2)) as s:
        body = {"prompt": PROMPT, "max_tokens": GEN, "ignore_eos": True, "temperature": 0, "model": "m"}
        plain = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60).json()
        with httpx.stream("POST", f"{s.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        s.wait_idle()
        text = httpx.get(f"{s.url}/metrics").text
        yield s, plain["usage"]["prompt_tokens"], _samples(text)


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict, name: str, **labels) -> float:
    (hit,) = [s for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return hit.value


def test_vllm_names_count_the_requests(scraped):
    server, prompt_tokens, samples = scraped
    ours = {"model_name": server.state.model_id, "engine": "0"}
    assert value(samples, "vllm:num_requests_running", **ours) == 0
    assert value(samples, "vllm:num_requests_waiting", **ours) == 0
    assert 0 <= value(samples, "vllm:kv_cache_usage_perc", **ours) <= 1
    assert value(samples, "vllm:gpu_cache_usage_perc", **ours) == value(samples, "vllm:kv_cache_usage_perc")
    assert value(samples, "vllm:prompt_tokens_total", **ours) == 2 * prompt_tokens
    assert value(samples, "vllm:generation_tokens_total", **ours) == 2 * GEN
    assert value(samples, "vllm:request_success_total", finished_reason="length", **ours) == 2
    stats = server.engine.stats()
    assert value(samples, "vllm:prefix_cache_queries_total") == stats["prefix_cache_queries"] >= prompt_tokens
    assert value(samples, "vllm:prefix_cache_hits_total") == stats["prefix_cache_hits"] >= 32
    assert value(samples, "vllm:num_preemptions_total") == 0
    # both requests, the non-streamed one too, have their time to first token and their gaps
    assert value(samples, "vllm:time_to_first_token_seconds_count") == 2
    assert value(samples, "vllm:inter_token_latency_seconds_count") >= 2
    assert value(samples, "vllm:e2e_request_latency_seconds_count") == 2
    assert value(samples, "vllm:request_generation_tokens_sum") == 2 * GEN
    assert value(samples, "vllm:request_prompt_tokens_sum") == 2 * prompt_tokens
    assert value(samples, "vllm:request_params_max_tokens_sum") == 2 * GEN
    assert value(samples, "ninfer_time_to_first_token_seconds_count") == 2
    # the queue's share of the time to first token, and the rest (prefill)
    assert value(samples, "ninfer_request_queue_time_seconds_count") == 2
    assert value(samples, "vllm:request_queue_time_seconds_count") == 2
    assert value(samples, "vllm:request_prefill_time_seconds_count") == 2
    ttft = value(samples, "vllm:time_to_first_token_seconds_sum")
    queued = value(samples, "vllm:request_queue_time_seconds_sum")
    assert 0 <= queued <= ttft and value(samples, "vllm:request_prefill_time_seconds_sum") <= ttft
    # admission to the last output: the request's whole time less its queue time
    assert value(samples, "vllm:request_inference_time_seconds_count") == 2
    e2e = value(samples, "vllm:e2e_request_latency_seconds_sum")
    assert value(samples, "vllm:request_inference_time_seconds_sum") == pytest.approx(e2e - queued, abs=1e-6)
    # the tokens each step ran: a step per prompt (the second's cached pages not run) and per later token
    assert value(samples, "vllm:iteration_tokens_total_count") == 2 * GEN
    run = 2 * prompt_tokens - stats["prefix_cache_hits"] + 2 * (GEN - 1)
    assert value(samples, "vllm:iteration_tokens_total_sum") == run
    assert value(samples, "vllm:iteration_tokens_total_bucket", le="1.0") == 2 * (GEN - 1)
    (cache,) = samples["vllm:cache_config_info"]
    assert cache.labels == {
        "block_size": "16",
        "cache_dtype": "fp32",
        "enable_prefix_caching": "True",
        "num_gpu_blocks": str(stats["kv_blocks_total"]),
        "engine": "0",
    }
    (lora,) = samples["vllm:lora_requests_info"]  # no adapters served (tests/api/test_lora_route.py has some)
    assert lora.labels == {"max_lora": "0", "waiting_lora_adapters": "", "running_lora_adapters": ""}


def test_llama_server_names(scraped):
    server, prompt_tokens, samples = scraped
    hits = server.engine.stats()["prefix_cache_hits"]
    assert value(samples, "llamacpp:prompt_tokens_total") == 2 * prompt_tokens - hits
    assert value(samples, "llamacpp:tokens_predicted_total") == 2 * GEN
    assert value(samples, "llamacpp:prompt_seconds_total") > 0
    assert value(samples, "llamacpp:tokens_predicted_seconds_total") > 0
    rate = value(samples, "llamacpp:predicted_tokens_seconds")
    assert rate == pytest.approx(
        2 * GEN / value(samples, "llamacpp:tokens_predicted_seconds_total"), rel=1e-6
    )
    assert value(samples, "llamacpp:requests_processing") == value(samples, "llamacpp:requests_deferred") == 0
    assert value(samples, "llamacpp:kv_cache_tokens") % server.engine.llm.engine_config.block_size == 0


def test_one_scrape_reads_the_engine_stats_once(scraped, monkeypatch):
    """ninfer's, vLLM's and llama-server's names of one scrape come from one read of the engine's stats."""
    server, _, _ = scraped
    reads = []
    real = server.engine.stats
    monkeypatch.setattr(server.engine, "stats", lambda: reads.append(1) or real())
    text = server.state.metrics.render().decode()
    assert len(reads) == 1 and "vllm:num_requests_running" in text and "llamacpp:kv_cache_tokens" in text
