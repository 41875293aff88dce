"""`ninfer chat`'s input: a message on one line, continued with a trailing backslash, or between lines of
three double quotes (pasted code kept as typed); `--prompt -` reads the message from stdin."""

from __future__ import annotations

import base64
import json

import pytest
from PIL import Image
from typer.testing import CliRunner

import ninfer_cli.chat as chat_cli
from ninfer_cli.chat_input import read_message
from ninfer_cli.main import app


def _reader(text: str):
    lines = iter(text.splitlines(keepends=True))
    prompts = []

    def read_line(prompt: str) -> str:
        prompts.append(prompt)
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    return read_line, prompts


def _messages(text: str) -> list[str]:
    read_line, _ = _reader(text)
    out = []
    while (message := read_message(read_line)) is not None:
        out.append(message)
    return out


@pytest.mark.parametrize(
    "typed, messages",
    [
        ("hello\nworld\n", ["hello", "world"]),
        ("one \\\ntwo\\\nthree\nnext\n", ["one \ntwo\nthree", "next"]),
        ('"""\ndef f(x):\n    return x\n"""\nafter\n', ["def f(x):\n    return x", "after"]),
        ('"""Review this:\n    indented\nend."""\n', ["Review this:\n    indented\nend."]),
        ('"""all on one line"""\n', ["all on one line"]),
        # opened bare: only an unindented line of three quotes ends it (a pasted docstring does not)
        (
            '"""\ndef f():\n    """Doc."""\n    """\n    More.\n    """\n"""\n',
            ['def f():\n    """Doc."""\n    """\n    More.\n    """'],
        ),
        ('"""Fix:\nx = 1 """\n', ["Fix:\nx = 1 "]),
        ('  """\n\n  a\n\n"""\n', ["\n  a\n"]),  # kept as typed; the REPL drops the blank lines around
        ('"""\nno closing line\n', ["no closing line"]),  # the end of input sends what came
        ("cut \\\n", ["cut \n"]),
        ("windows line\r\n", ["windows line"]),
        ("", []),
    ],
)
def test_messages_as_typed(typed, messages):
    assert _messages(typed) == messages


def test_continued_lines_get_their_own_prompt():
    read_line, prompts = _reader('"""\na\n"""\nb \\\nc\n')
    assert read_message(read_line) == "a" and read_message(read_line) == "b \nc"
    assert prompts == ["> ", "... ", "... ", "> ", "... "]


class _Recorder:
    """RemoteChat's stand-in: records what the REPL sends."""

    sent: list[list[dict]] = []

    def __init__(self, *args, **kwargs):
        self.description = "recorder"

    def reply(self, messages, params, stats=None, progress=None):
        _Recorder.sent.append([dict(m) for m in messages])
        yield "ok"


def _typed_into_chat(monkeypatch, backend, typed: str):
    """`ninfer chat --url ...` with `typed` as its input and `backend` answering; what it sent is in
    _Recorder.sent."""
    monkeypatch.setattr(chat_cli, "RemoteChat", backend)
    _Recorder.sent = []
    return CliRunner().invoke(app, ["chat", "--url", "http://127.0.0.1:9"], input=typed)


def test_the_repl_sends_a_pasted_block_as_one_message(monkeypatch):
    typed = 'first\n"""\n\n/reset\n    code()\n\n"""\nsecond \\\nline\n/exit\n'
    result = _typed_into_chat(monkeypatch, _Recorder, typed)
    assert result.exit_code == 0, result.output
    assert [m[-1]["content"] for m in _Recorder.sent] == ["first", "/reset\n    code()", "second \nline"]
    assert len(_Recorder.sent[-1]) == 5  # the conversation kept: a command inside a block is text


def test_repl_commands_help_clear_and_a_mistyped_one_never_reach_the_model(monkeypatch):
    """/help lists the commands, /clear is /reset, a line of one unknown /word is said to be no command
    (not sent), and the same word after a space, or a path with more to it, goes as a message."""
    typed = "first\n/help\n/rset\n/clear\n /rset\n/usr/bin holds it\n/exit\n"
    result = _typed_into_chat(monkeypatch, _Recorder, typed)
    assert result.exit_code == 0, result.output
    assert result.output.count("Commands: /reset (or /clear)") == 2  # the banner's, then /help's
    assert "unknown command /rset; /help lists them" in result.output
    assert "conversation cleared" in result.output
    assert [m[-1]["content"] for m in _Recorder.sent] == ["first", "/rset", "/usr/bin holds it"]
    assert len(_Recorder.sent[1]) == 1  # /clear emptied the conversation before it


def test_prompt_dash_reads_stdin(monkeypatch):
    monkeypatch.setattr(chat_cli, "RemoteChat", _Recorder)
    _Recorder.sent = []
    result = CliRunner().invoke(
        app, ["chat", "--url", "http://x:1", "-p", "-"], input="\n  Explain:\n  x = 1\n\n"
    )
    assert result.exit_code == 0 and result.output.strip() == "ok"
    assert _Recorder.sent == [[{"role": "user", "content": "  Explain:\n  x = 1"}]]
    result = CliRunner().invoke(app, ["chat", "--url", "http://x:1", "-p", "-"], input="  \n")
    assert result.exit_code == 2 and "--prompt - reads the message from standard input" in result.output


def test_a_terminal_session_edits_lines_and_keeps_its_history(tmp_path):
    """At a terminal (a pty here) the REPL reads through readline: earlier sessions' lines come back from
    $NINFER_HOME/chat_history (the up arrow), and this session's are added to it on exit."""
    import importlib.util
    import os
    import pty
    import subprocess
    import sys
    import time

    if importlib.util.find_spec("readline") is None:
        pytest.skip("this Python has no readline module (the REPL then reads with plain input)")
    try:
        main, child = pty.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here ({e})")
    home = tmp_path / "home"
    home.mkdir()
    (home / "chat_history").write_text("Say yes.\n")
    env = {**os.environ, "NINFER_HOME": str(home), "TERM": "dumb"}
    cmd = [sys.executable, "-m", "ninfer_cli.main", "chat", "--max-tokens", "2", "--verbose"]
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    seen = b""

    def until(text: bytes, count: int) -> None:
        nonlocal seen
        deadline = time.monotonic() + 120
        while seen.count(text) < count:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            seen += os.read(main, 4096)

    until(b"> ", 1)
    os.write(main, b"\x1b[A\r")  # the up arrow brings back the earlier session's line: sent again
    until(b"tok/s", 1)
    until(b"> ", 2)
    os.write(main, b"hello\r")
    until(b"tok/s", 2)
    until(b"> ", 3)
    os.write(main, b"/exit\r")
    assert proc.wait(timeout=60) == 0, seen.decode(errors="replace")
    os.close(main)
    assert b"\x1b[A" not in seen and b"Say yes." in seen  # the arrow read by readline, the line shown
    # (readline keeps a line again only where it differs from the one before)
    assert (home / "chat_history").read_text().splitlines() == ["Say yes.", "hello", "/exit"]


class _Numbered(_Recorder):
    """Replies "reply 1", "reply 2", ... (so a retried reply differs from the one it replaces)."""

    def reply(self, messages, params, stats=None, progress=None):
        _Recorder.sent.append([dict(m) for m in messages])
        yield f"reply {len(_Recorder.sent)}"

    def attach(self, data):
        return "attached"


def test_undo_retry_and_the_system_message_change_what_is_sent(monkeypatch):
    typed = "/retry\n/undo\nfirst\nsecond\n/undo\n/retry\n/system Be terse.\n/system\nthird\n/exit\n"
    result = _typed_into_chat(monkeypatch, _Numbered, typed)
    assert result.exit_code == 0, result.output
    assert "there is no reply to retry yet" in result.output and "nothing to undo yet" in result.output
    assert "the last exchange is undone" in result.output and "system message: 'Be terse.'" in result.output
    first, second, retried, third = _Recorder.sent
    assert [m["content"] for m in second] == ["first", "reply 1", "second"]
    assert retried == [{"role": "user", "content": "first"}]  # /undo took "second" back, /retry "reply 1"
    assert third == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply 3"},
        {"role": "user", "content": "third"},
    ]


def test_compact_replaces_the_turns_with_the_models_summary(monkeypatch):
    typed = "/compact\n/system Be terse.\nfirst\nsecond\n/compact\nthird\n/undo\n/exit\n"
    result = _typed_into_chat(monkeypatch, _Numbered, typed)
    assert result.exit_code == 0, result.output
    assert "there is nothing to compact yet" in result.output
    assert "the conversation is compacted: 4 turns into the summary above" in result.output
    first, second, summarised, third = _Recorder.sent
    assert [m["role"] for m in summarised] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert summarised[-1]["content"].startswith("Your context is nearly full")
    assert third == [
        {"role": "system", "content": "Be terse."},
        {
            "role": "user",
            "content": "Summary of the conversation before this point (it was compacted):\nreply 3",
        },
        {"role": "user", "content": "third"},
    ]
    assert "the last exchange is undone" in result.output  # third and its reply; the summary stays


def test_a_summary_is_kept_without_the_reasoning_before_it():
    from engine.errors import NinferError
    from ninfer_cli.chat_session import Conversation

    convo = Conversation(None)
    convo.ask("hi")
    convo.answered("hello")
    assert convo.compacted("<think>\nWhat matters here?\n</think>\n\nThey said hi.").startswith(
        "the conversation"
    )
    assert convo.turns == [
        {
            "role": "user",
            "content": "Summary of the conversation before this point (it was compacted):\nThey said hi.",
        }
    ]
    with pytest.raises(NinferError, match="wrote no summary"):
        convo.compacted("<think>hmm</think>  ")


def test_a_conversation_saved_loads_back_pictures_included(monkeypatch, tmp_path):
    picture = tmp_path / "dot.png"
    Image.new("RGB", (4, 4), "red").save(picture)
    saved = tmp_path / "talk.json"
    typed = f"/system Be kind.\n/image {picture}\nwhat is it?\n/save {saved}\n/exit\n"
    result = _typed_into_chat(monkeypatch, _Numbered, typed)
    assert result.exit_code == 0 and f"saved 2 messages to {saved}" in result.output, result.output
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    url = messages[1]["content"][0]["image_url"]["url"]
    assert (
        url.startswith("data:image/png;base64,")
        and base64.b64decode(url.split(",")[1]) == picture.read_bytes()
    )
    _Recorder.sent = []
    result = CliRunner().invoke(
        app, ["chat", "--url", "http://127.0.0.1:9"], input=f"/load {saved}\nand now?\n/exit\n"
    )
    assert f"loaded 2 messages from {saved} (and a system message)" in result.output, result.output
    (sent,) = _Recorder.sent
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[1]["content"][0] == {"type": "image", "data": picture.read_bytes()}
    assert sent[1]["content"][1] == {"type": "text", "text": "what is it?"}


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "is not JSON"),
        ('{"role": "user"}', "takes a JSON array of chat messages"),
        ('[{"role": "tool", "content": "x"}]', "role is system, user or assistant"),
        (
            '[{"role": "user", "content": "a"}, {"role": "system", "content": "s"}]',
            "a system message goes first",
        ),
        (
            '[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]',
            "base64 data URL",
        ),
        ('[{"role": "assistant", "content": 3}]', "its content must be text"),
    ],
)
def test_a_file_that_is_no_conversation_is_refused_and_the_conversation_kept(
    monkeypatch, tmp_path, content, words
):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    typed = f"first\n/load {bad}\n/load {tmp_path / 'none.json'}\n/save {tmp_path}/no/such/dir.json\n/load\nsecond\n/exit\n"
    result = _typed_into_chat(monkeypatch, _Numbered, typed)
    assert result.exit_code == 0 and words in result.output, result.output
    assert "cannot read" in result.output and "cannot write" in result.output
    assert "/load takes a file: /load PATH" in result.output
    assert [m["content"] for m in _Recorder.sent[-1]] == ["first", "reply 1", "second"]


def test_a_failed_engine_step_is_said_and_the_conversation_goes_on(monkeypatch, tmp_path):
    """The local engine's step raising once: the reply is an error line, the message is taken back (not in
    the conversation), and the next one is answered."""
    from engine.worker.model_runner import ModelRunner

    real, failed = ModelRunner.execute, []

    def execute(self, sched):
        if sched.scheduled and not failed:
            failed.append(1)
            raise RuntimeError("boom in the step")
        return real(self, sched)

    monkeypatch.setattr(ModelRunner, "execute", execute)
    saved = tmp_path / "convo.json"
    typed = f"What is the capital of France?\nWhat is the capital of France?\n/save {saved}\n/exit\n"
    result = CliRunner().invoke(app, ["chat", "--max-tokens", "12"], input=typed)
    assert result.exit_code == 0, result.output
    assert "error: the engine failed while running this request (RuntimeError: boom in the step)" in (
        " ".join(result.output.split())
    )
    assert "Paris" in result.output
    assert [m["role"] for m in json.loads(saved.read_text())] == ["user", "assistant"]


def test_a_long_prompt_shows_how_far_it_has_been_read_on_a_terminal_only():
    import io

    from engine import LLM, SamplingParams
    from ninfer_cli.chat_backends import LocalChat, PromptProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen, pipe = Terminal(), io.StringIO()
    backend = LocalChat(LLM(prefill_chunk=32))
    message = [{"role": "user", "content": "Repeat after me: " + "one two three four five " * 20}]
    params = SamplingParams(max_tokens=4, temperature=0)
    progress = PromptProgress(screen)
    shown_before_text = []

    for _ in backend.reply(message, params, None, progress):
        shown_before_text.append(screen.getvalue())
    lines = shown_before_text[0].split("\r")
    assert lines[1].startswith("[reading the prompt: ") and lines[1].endswith(" tokens]")
    percents = [int(line.split(": ")[1].split("%")[0]) for line in lines[1:-1]]
    assert len(percents) >= 2 and percents == sorted(percents) and percents[-1] < 100
    assert screen.getvalue().endswith("\r\x1b[K") and not progress.shown  # cleared as the reply began
    quiet = PromptProgress(pipe)
    list(backend.reply([{"role": "user", "content": "Again: " + message[0]["content"]}], params, None, quiet))
    assert pipe.getvalue() == ""


def test_a_conversation_near_the_context_is_said_to_be_with_what_to_do():
    """The local engine's REPL: a reply that takes the conversation to 3/4 of the context or more is
    followed by a line saying so (and /compact); one well below it is not."""
    typed = "Hi\n" + "Tell me more about the capital of France and its history. " * 9 + "\n/exit\n"
    result = CliRunner().invoke(app, ["chat", "--max-tokens", "8", "--max-context", "200"], input=typed)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if "-token context" in line]
    assert len(notes) == 1, result.output  # the first exchange is short; the second passes 150 tokens
    assert "of the 200-token context" in notes[0] and "/compact" in " ".join(result.output.split())


def test_the_context_note_counts_the_prompt_and_the_reply():
    from ninfer_cli.chat_backends import ReplyStats

    stats = ReplyStats(0.0, prompt_tokens=140, completion_tokens=10)
    assert stats.context_note(200) == (
        "the conversation takes 150 of the 200-token context (75%); /compact has the model summarise it, "
        "/reset clears it"
    )
    assert ReplyStats(0.0, prompt_tokens=100, completion_tokens=49).context_note(200) is None
    assert stats.context_note(None) is None and ReplyStats(0.0).context_note(200) is None
