"""`ninfer chat --url`: the terminal chat against a running server, with the local chat's answers; what
the server refuses, and a server that is not there, are one line."""

from __future__ import annotations

import io
import json

import pytest
from server import RunningServer
from typer.testing import CliRunner

from engine.async_llm import AsyncLLM
from ninfer_cli.main import app

runner = CliRunner()
QUESTION = "What is the capital of France?"


def _chat(*args, stdin: str | None = None):
    """(greedy both ways: over --url the server's defaults apply otherwise, which for this model sample)"""
    result = runner.invoke(app, ["chat", "--max-tokens", "16", "--temperature", "0", *args], input=stdin)
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
    assert "ask for 8191 at most" in out
    assert "Traceback" not in out


def test_json_schema_and_grammar_file_locally_and_over_http(server, tmp_path):
    """--json-schema / --grammar-file hold the reply, on the local engine and through a server (as
    response_format / structured_outputs), with the same words."""
    schema = '{"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"], "additionalProperties": false}'
    (tmp_path / "schema.json").write_text(schema)
    (tmp_path / "yes_no.gbnf").write_text('root ::= "The answer is " ("yes" | "no") "."')
    for flags in (
        ["--json-schema", schema],
        ["--json-schema", str(tmp_path / "schema.json")],
        ["--grammar-file", str(tmp_path / "yes_no.gbnf")],
    ):
        code, local = _chat("--prompt", "Is Paris in France?", *flags)
        assert code == 0, local
        code, remote = _chat("--url", server.url, "--prompt", "Is Paris in France?", *flags)
        assert code == 0, remote
        assert local.strip() == remote.strip()
        text = local.strip()
        assert text in ('{"answer": "yes"}', '{"answer": "no"}', "The answer is yes.", "The answer is no.")
    for flags, words in (
        (["--json-schema", "{bad"], "--json-schema is not JSON"),
        (["--json-schema", schema, "--grammar-file", str(tmp_path / "yes_no.gbnf")], "not both"),
        (["--grammar-file", str(tmp_path / "none.gbnf")], "is not a file"),
        (["--grammar-file", str(tmp_path / "schema.json")], "neither Lark nor GBNF"),
    ):
        code, out = _chat("--prompt", "hi", *flags)
        assert code == 2 and words in out and "Traceback" not in out, out


def test_engine_flags_do_not_apply_to_a_server(server):
    """--device cuda on a machine without CUDA is no concern of a chat with a server."""
    code, out = _chat("--url", server.url, "--prompt", QUESTION, "--device", "cuda")
    assert code == 0 and "Paris" in out, out


def test_verbose_prints_each_replys_tokens_and_rates_locally_and_over_http(server):
    """--verbose: after the reply, its prompt tokens (from the engine, or the server's usage), the time to
    the first token and the decode rate; the same token counts either way."""
    import re

    lines = {}
    for where, args in (("local", ()), ("remote", ("--url", server.url))):
        code, out = _chat(*args, "--prompt", QUESTION, "--verbose")
        assert code == 0, out
        (line,) = [ln for ln in out.splitlines() if "first token" in ln]
        pattern = r"prompt \d+ tokens( \(\d+ cached\))? · first token \d+ ms · \d+ tokens at [\d.]+ tok/s"
        assert re.fullmatch(pattern, line), line
        # the server may hold the question in its prefix cache from an earlier test
        lines[where] = re.sub(r" \(\d+ cached\)|first token \d+ ms|at [\d.]+ tok/s", "", line)
    assert lines["local"] == lines["remote"]


def test_over_http_only_the_sampling_flags_given_are_sent(monkeypatch):
    """The server's sampling defaults (its --generation-config: Qwen3's recommended temperature, top-p and
    top-k) apply to what the flags leave out, as for any OpenAI client; the flags given are sent."""
    sent = []

    class _Server:
        model = "m"

        def __init__(self, *args):
            pass

        def chat(self, messages, sampling, usage, progress=None):
            sent.append(sampling)
            yield "ok"

    monkeypatch.setattr("engine.bench.drivers.OverHttp", _Server)
    for flags, want in (
        ((), {"max_tokens": 16}),
        (("--temperature", "0.7", "--top-k", "20"), {"max_tokens": 16, "temperature": 0.7, "top_k": 20}),
        (("--top-p", "0.9", "--seed", "3"), {"max_tokens": 16, "top_p": 0.9, "seed": 3}),
        (
            ("--chat-template-kwargs", '{"enable_thinking": false}'),
            {"max_tokens": 16, "chat_template_kwargs": {"enable_thinking": False}},
        ),
    ):
        sent.clear()
        result = runner.invoke(app, ["chat", "--url", "http://x:1", "--max-tokens", "16", "-p", "hi", *flags])
        assert result.exit_code == 0 and result.output.strip() == "ok", result.output
        assert sent == [want]


def test_sampling_overrides_reach_the_replies_both_ways(server):
    """--override-generation-config: any sampling field, sent over --url as a request field, applied by
    the local engine the same way."""
    ask = "Write the line 'the cat sat on the mat' five times."
    overrides = ("--override-generation-config", '{"repetition_penalty": 1.3, "dry_multiplier": 0.8}')
    code, plain = _chat("--prompt", ask)
    assert code == 0, plain
    code, local = _chat("--prompt", ask, *overrides)
    assert code == 0, local
    code, remote = _chat("--url", server.url, "--prompt", ask, *overrides)
    assert code == 0, remote
    assert remote.strip() == local.strip() != plain.strip()
    code, out = _chat("--prompt", "hi", "--override-generation-config", '{"typical_p": 3}')
    assert code == 2 and out.count("\n") == 1 and "typical_p must be in (0, 1]" in out, out


def test_template_kwargs_reach_the_local_template(tmp_path):
    """--chat-template-kwargs: variables the chat template renders with (its own check before loading)."""
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n{{ opening | default('') }}"
    )
    replies = {}
    for opening in (None, "Sure! The city is"):
        kwargs = () if opening is None else ("--chat-template-kwargs", json.dumps({"opening": opening}))
        code, out = _chat("--chat-template", str(template), *kwargs, "--prompt", QUESTION)
        assert code == 0, out
        replies[opening] = out.strip()
    assert replies[None] != replies["Sure! The city is"]
    code, out = _chat("--chat-template-kwargs", '{"messages": []}', "--prompt", "hi")
    assert code == 2 and out.count("\n") == 1, out
    assert "--chat-template-kwargs sets messages, which the renderer sets itself" in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_prompt_shows_its_progress_over_http():
    """The server sends prompt_progress (return_progress) while it reads a prompt in several chunks: the
    line shows it and is cleared as the reply begins, as in the local chat; a server that does not answer
    /props as llama-server does is not asked."""
    from engine import SamplingParams
    from ninfer_cli.chat_backends import PromptProgress, RemoteChat

    messages = [{"role": "user", "content": "Tell me about this list: " + ", ".join(map(str, range(60)))}]
    params = SamplingParams(max_tokens=4, temperature=0)
    with RunningServer(AsyncLLM(prefill_chunk=32), model_id="smollm2") as s:
        chat = RemoteChat(s.url, None, None, sampling={"temperature": 0})
        assert chat.server.takes_progress
        screen = _Terminal()
        reply = "".join(chat.reply(messages, params, progress=PromptProgress(screen)))
        shown = screen.getvalue()
        assert reply and "[reading the prompt: " in shown and shown.endswith("\r\x1b[K")
        percents = [int(p.split("%")[0]) for p in shown.split("[reading the prompt: ")[1:]]
        assert len(percents) >= 3 and percents == sorted(percents) and percents[-1] < 100
        chat.server.takes_progress = False  # (as for vLLM or OpenAI's API: nothing asked, nothing shown)
        screen = _Terminal()
        assert "".join(chat.reply(messages, params, progress=PromptProgress(screen))) == reply
        assert screen.getvalue() == ""
