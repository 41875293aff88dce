"""`ninfer chat --url`: the terminal chat against a running server, with the local chat's answers; what
the server refuses, and a server that is not there, are one line."""

from __future__ import annotations

import pytest
from server import RunningServer
from typer.testing import CliRunner

from engine.async_llm import AsyncLLM
from ninfer_cli.main import app

runner = CliRunner()
QUESTION = "What is the capital of France?"


def _chat(*args, stdin: str | None = None):
    result = runner.invoke(app, ["chat", "--max-tokens", "16", *args], input=stdin)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=2), model_id="smollm2") as s:
        yield s


def test_one_shot_over_http_answers_as_the_local_chat(server):
    code, remote = _chat("--url", server.url, "--prompt", QUESTION)
    assert code == 0, remote
    code, local = _chat("--prompt", QUESTION)
    assert code == 0, local
    assert "Paris" in remote and remote.strip() == local.strip()


def test_conversation_over_http_answers_as_the_local_one(server):
    stdin = f"{QUESTION}\nAnd of Italy?\n/exit\n"
    code, remote = _chat("--url", server.url + "/v1", "--system", "Answer briefly.", stdin=stdin)
    assert code == 0, remote
    assert f"{server.url}/v1 (model smollm2)" in remote and "error" not in remote
    code, local = _chat("--system", "Answer briefly.", stdin=stdin)
    replies = [[ln for ln in out.splitlines() if ln.startswith("> ")] for out in (remote, local)]
    assert len(replies[0]) == 3 and replies[0] == replies[1]  # two replies, then the prompt /exit answers


def test_refusals_are_one_line(server, tmp_path):
    code, out = _chat("--url", "http://127.0.0.1:1", "--prompt", "hi")
    assert code == 2 and "cannot reach 127.0.0.1:1" in out and "is the server running?" in out
    code, out = _chat("some/model", "--url", server.url, "--prompt", "hi")
    assert code == 2 and "give a MODEL or --url, not both" in out
    code, out = _chat("--url", server.url, "--prompt", "hi", "--max-tokens", "100000")
    assert code == 2 and "the server answered 400: max_tokens 100000 is beyond the context limit" in out
    assert "Traceback" not in out
