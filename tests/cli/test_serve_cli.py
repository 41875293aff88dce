"""`ninfer serve` with no model: serves the embedded default, answers, and stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal

import httpx2 as httpx
import pytest
from conftest import run_serve
from serve_process import start_serve

pytestmark = pytest.mark.slow


def test_serve_default_model_then_sigterm():
    """While the model loads, /health answers 503 "loading" (with Retry-After) on the port; then the
    model answers on the same port."""
    loading: list[httpx.Response] = []
    proc, port = start_serve("--api-key", "k", "--max-context", "4k", "--host-cache", "64M", answers=loading)
    assert loading and all(
        r.status_code == 503 and r.json()["status"] == "loading" and r.headers["retry-after"] == "5"
        for r in loading
    )
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": "Bearer k"},
            json={
                "model": "x",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16,
                "temperature": 0,
            },
            timeout=60,
        )
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        total = next(ln for ln in metrics.splitlines() if ln.startswith("ninfer_host_cache_pages_total "))
        assert float(total.split()[1]) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "host cache: " in err and "KV pages" in err
    # what the engine is, as allocated, in one line (the KV dtype applied, the pool beside the context)
    assert re.search(
        r"ready in [\d.]+ s: cpu float32, context 4,096 tokens, KV pool [\d,]+ tokens \(fp32, [\d.]+ GiB\), "
        r"4 running at most, CUDA graphs off\n",
        err,
    ), err


def test_the_prefix_cache_file_carries_a_prompt_across_a_restart(tmp_path):
    """serve --prefix-cache-file: SIGTERM writes the prefix cache; the next serve reads it into the host
    tier, and the same conversation's prompt is served from it (usage's cached_tokens)."""
    file = tmp_path / "prefix.cache"
    args = ("--max-context", "4k", "--host-cache", "64M", "--prefix-cache-file", str(file))
    body = {
        "messages": [
            {"role": "user", "content": "Name three rivers of Europe and the seas they flow into. " * 8}
        ],
        "max_tokens": 4,
        "temperature": 0,
    }
    cached, logs = [], []
    for _ in range(2):
        proc, port = start_serve(*args)
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        logs.append(err)
    assert cached[0] == 0 and cached[1] >= 96
    assert "not there yet (written at shutdown)" in logs[0] and f"written to {file}" in logs[0]
    assert "read into the host tier" in logs[1]


def test_serve_refuses_bad_flags():
    proc = run_serve("--max-context", "lots")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "error: --max-context 'lots' is not a size; write e.g. 180k, 131072, 24G or 24GiB"
    )
    proc = run_serve("--spec", "ngram", "--prediction-tokens", "0", "--port", "0")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: prediction_tokens must be between 1 and 64 (got 0)")
    assert proc.stderr.count("\n") == 1
    proc = run_serve("--state-snapshots", "-1")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: state_snapshots must be >= 0 (got -1)"
    proc = run_serve("--host-state-snapshots", "-1")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: host_state_snapshots must be >= 0 (got -1)"
    proc = run_serve("--no-enable-prefix-caching", "--host-state-snapshots", "4")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --host-state-snapshots keeps the prefix cache's state snapshots; it needs prefix caching on"
    )
    proc = run_serve("--sleep-idle-seconds", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --sleep-idle-seconds must be a positive number of seconds, or -1 to stay awake (got 0)"
    )


def test_serve_sleeps_when_idle_and_a_request_wakes_it():
    """serve --sleep-idle-seconds: asleep (GET /is_sleeping) a moment after start, /health answered asleep,
    a chat request wakes it and is answered; the log says both."""
    import time

    proc, port = start_serve("--max-context", "2k", "--sleep-idle-seconds", "0.5")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not httpx.get(f"{url}/is_sleeping", timeout=10).json()["is_sleeping"]:
            assert time.monotonic() < deadline, "the server did not fall asleep"
            time.sleep(0.1)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        body = {"model": "x", "messages": ask, "max_tokens": 16, "temperature": 0}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "sleeps after 0.5 s without a request, holding " in err
    assert "asleep (level 1): " in err and "awake in " in err and "Traceback" not in err
