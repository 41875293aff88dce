"""The scripts in examples/ run as a user runs them, against a live server on the embedded default model
(NINFER_URL points them at it): each prints its replies, and where the model cannot do what an example
asks (infill, rerank, images), the server's sentence or the script's usage line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=2)) as s:
        yield s


def _run(name: str, url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NINFER_URL": url}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_openai_client(server):
    done = _run("openai_client.py", server.url)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "The capital of France is Paris." and lines[1].startswith("cached prompt tokens:")
    assert '{"city": "Paris", "country": "France"}' in lines
    assert "prediction tokens accepted / rejected:" in lines[-1]


def test_anthropic_client(server):
    done = _run("anthropic_client.py", server.url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("end_turn ['text']") or done.stdout.startswith("max_tokens ['text']")


def test_offline_generate():
    done = _run("offline_generate.py", "unused")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Paris" in done.stdout.splitlines()[0]


@pytest.mark.parametrize(
    "name, args, words",
    [
        ("infill_client.py", (), "this model has no fill-in-the-middle tokens"),
        ("rerank_client.py", (), "this model is not a reranker"),
        ("image_client.py", (), "usage: python examples/image_client.py IMAGE_FILE"),
    ],
)
def test_what_the_default_model_cannot_do_is_one_line(server, name, args, words):
    done = _run(name, server.url, *args)
    assert done.returncode != 0 and words in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
