"""Snapshot hints from the HTTP routes (engine/api/snapshot_hints.py): where the tool list ends (every
route with tools) and where each `cache_control` mark's prefix ends (Anthropic's; on chat completions,
OpenRouter's and LiteLLM's), as the prompt position up to which the request cut there renders alike; a
hybrid model resumes a new session there, and an agent where it stopped after its subagent's turns;
malformed marks are 400s in a sentence."""

from __future__ import annotations

import json
from dataclasses import replace

import anthropic
import httpx2 as httpx
import openai
import pytest
from conftest import save_tiny, tiny_hf_model
from scripted_engine import QWEN_STYLE_TEMPLATE, ScriptedEngine
from server import RunningServer

from engine.async_llm import AsyncLLM
from engine.cache.state_pool import StatePool

MARK = {"type": "ephemeral"}
TOOLS = [
    {"name": "read", "description": "Read a file. " * 6, "input_schema": {"type": "object"}},
    {"name": "grep", "description": "Search files. " * 6, "input_schema": {"type": "object"}},
]
SYSTEM = "You are a coding agent; edit with care. "
# Qwen3.5's order: the tool list first in the system turn, then the system prompt
TOOLS_FIRST = """{%- if tools %}<|im_start|>system
# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>{% if messages[0].role == 'system' %}

{{ messages[0].content }}{% endif %}<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}<|im_start|>assistant
"""


def _marked(block: dict) -> dict:
    return {**block, "cache_control": MARK}


def _body(system: list[dict], messages: list[dict], tools: list[dict] = TOOLS) -> dict:
    return {"model": "m", "max_tokens": 4, "tools": tools, "system": system, "messages": messages}


def _split(engine: ScriptedEngine, n: int = 0) -> list[tuple[str, str]]:
    """(the prompt's text before each hint, the text after it) of request `n`."""
    ids, decode = engine.prompt_ids[n], engine.tokenizer.decode
    return [
        (decode(ids[:h], skip_special_tokens=False), decode(ids[h:], skip_special_tokens=False))
        for h in engine.snapshot_hints[n]
    ]


def test_each_marked_block_ends_a_hint_where_the_prompt_stops_depending_on_what_follows():
    """A system block's mark: the hint is past its text, short of the next block's; a tool_result's: past
    its content, short of the message's next block; the last tool's, with a template that writes the system
    prompt before the tools: only the system turn's start does not depend on what follows the tools."""
    engine = ScriptedEngine(["ok"])
    system = [_marked({"type": "text", "text": SYSTEM * 4}), {"type": "text", "text": "cwd: /home/ada"}]
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "def parse(): ... " * 8}
    messages = [
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [_marked(result), {"type": "text", "text": "Go on."}]},
    ]
    tools = [TOOLS[0], _marked(TOOLS[1])]
    with RunningServer(engine) as s:
        r = httpx.post(f"{s.url}/v1/messages", json=_body(system, messages, tools), timeout=30)
        assert r.status_code == 200, r.text
    (tools_head, _), (system_head, system_tail), (result_head, result_tail) = _split(engine)
    assert tools_head == "<|im_start|>system\n"  # the test template: system prompt, then tools
    assert system_head.rstrip().endswith(SYSTEM.strip()) and system_tail.lstrip().startswith("cwd: /home/ada")
    assert result_head.endswith("def parse(): ... \n</tool_response><|im_end|>\n<|im_start|>")
    assert result_tail.startswith("user\nGo on.")
    assert max(engine.snapshot_hints[0]) < len(engine.prompt_ids[0])


def test_with_the_tools_first_a_mark_on_the_last_tool_ends_its_hint_after_the_tool_list():
    engine = ScriptedEngine(["ok"])
    engine.tokenizer = replace(engine.tokenizer, chat_template=TOOLS_FIRST)
    body = _body(
        [{"type": "text", "text": SYSTEM}], [{"role": "user", "content": "hi"}], [TOOLS[0], _marked(TOOLS[1])]
    )
    with RunningServer(engine) as s:
        assert httpx.post(f"{s.url}/v1/messages", json=body, timeout=30).status_code == 200
    [(head, tail)] = _split(engine)
    assert head.endswith('Search files. ", "parameters": {"type": "object"}}}</tools>')
    assert tail.lstrip().startswith(SYSTEM.strip())


def test_no_hints_without_tools_or_marks_or_where_the_engine_keeps_no_snapshots():
    engine = ScriptedEngine(["ok", "ok"])
    engine.tokenizer = replace(engine.tokenizer, chat_template=TOOLS_FIRST)
    system = [_marked({"type": "text", "text": SYSTEM}), {"type": "text", "text": "cwd: /"}]
    with RunningServer(engine) as s:
        body = _body([{"type": "text", "text": SYSTEM}], [{"role": "user", "content": "hi"}], [])
        assert httpx.post(f"{s.url}/v1/messages", json=body, timeout=30).status_code == 200
        engine.snapshots_enabled = False  # an attention-only model reuses any page: nothing to work out
        body = _body(system, [{"role": "user", "content": "hi"}])
        assert httpx.post(f"{s.url}/v1/messages", json=body, timeout=30).status_code == 200
    assert engine.snapshot_hints == [(), ()]


def test_openai_format_marks_end_hints_on_a_tool_a_content_part_and_a_message():
    """Chat completions with `cache_control` where OpenRouter and LiteLLM take it: on the first tool (its
    hint past that tool, short of the next; the mark is not in the tool the template writes), on the first
    of the system message's content parts (past its text, short of the next part's), and on a whole
    message (past it, short of the next message)."""
    engine = ScriptedEngine(["ok"])
    engine.tokenizer = replace(engine.tokenizer, chat_template=TOOLS_FIRST)
    tools = _openai_tools()
    tools[0]["cache_control"] = MARK
    system = [_marked({"type": "text", "text": SYSTEM * 4}), {"type": "text", "text": "\ncwd: /home/ada"}]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Fix the failing test.", "cache_control": MARK},
        {"role": "assistant", "content": "On it."},
        {"role": "user", "content": "Go on."},
    ]
    body = {"model": "m", "max_tokens": 4, "tools": tools, "messages": messages}
    with RunningServer(engine) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
    (tool_head, tool_tail), (listed, _), (system_head, system_tail), (user_head, user_tail) = _split(engine)
    assert tool_head.endswith('"parameters": {}}') and tool_tail.startswith(
        '}{"type": "function", "function": {"name": "grep"'
    )
    assert "cache_control" not in engine.tokenizer.decode(engine.prompt_ids[0])
    assert listed.endswith("</tools>")
    assert system_head.endswith(SYSTEM * 4) and system_tail.startswith("\ncwd: /home/ada")
    # (the cut's generation prompt opens the assistant turn that follows it in the prompt)
    assert user_head.endswith("Fix the failing test.<|im_end|>\n<|im_start|>assistant")
    assert user_tail.lstrip().startswith("On it.")


@pytest.mark.parametrize(
    "where, mark, words",
    [
        (
            "part",
            {"type": "persistent"},
            'messages[0].content[0].cache_control must be {"type": "ephemeral"}',
        ),
        ("message", {"type": "ephemeral", "ttl": "1d"}, "messages[0].cache_control.ttl must be '5m' or '1h'"),
        ("tool", "yes", 'tools[0].cache_control must be {"type": "ephemeral"}'),
        ("five", MARK, "at most 4 blocks may carry cache_control, and 5 do"),
    ],
)
def test_a_malformed_openai_format_mark_is_a_400_that_names_it(where, mark, words):
    engine = ScriptedEngine(["ok"])
    part = {"type": "text", "text": SYSTEM} | ({"cache_control": mark} if where in ("part", "five") else {})
    message = {"role": "system", "content": [part]} | ({"cache_control": mark} if where == "message" else {})
    tools = [t | ({"cache_control": mark} if where in ("tool", "five") else {}) for t in _openai_tools()]
    messages = [
        message,
        {"role": "user", "content": "hi", **({"cache_control": mark} if where == "five" else {})},
    ]
    if where == "five":
        messages.append({"role": "assistant", "content": "ok", "cache_control": mark})
    body = {"model": "m", "max_tokens": 4, "tools": tools, "messages": messages}
    with RunningServer(engine) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(words), r.text
    assert engine.prompts == []


def _openai_tools() -> list[dict]:
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": {}},
        }
        for t in TOOLS
    ]


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions", "/v1/responses", "/api/chat"])
def test_every_route_hints_where_the_tool_list_ends(route):
    """Unmarked, on each protocol: with a template that writes the tools first, the hint is right after the
    tool list, before the system prompt; with one that writes the system prompt first, the tool list alone
    shares only the turn's opening with the prompt (a hint inside the first page, which the scheduler drops)."""
    for template, shared in ((TOOLS_FIRST, "</tools>"), (QWEN_STYLE_TEMPLATE, "<|im_start|>system\n")):
        engine = ScriptedEngine(["ok"])
        engine.tokenizer = replace(engine.tokenizer, chat_template=template)
        user = [{"role": "user", "content": "hi"}]
        if route == "/v1/messages":
            body = _body([{"type": "text", "text": SYSTEM}], user)
        elif route in ("/v1/chat/completions", "/api/chat"):
            body = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, *user], "stream": False}
            body["tools"] = _openai_tools()
        else:
            body = {"model": "m", "instructions": SYSTEM, "input": "hi"}
            body["tools"] = [{"type": "function", **t["function"]} for t in _openai_tools()]
        with RunningServer(engine) as s:
            r = httpx.post(f"{s.url}{route}", json=body, timeout=30)
            assert r.status_code == 200, r.text
        [(head, tail)] = _split(engine)
        assert head.endswith(shared) and SYSTEM.strip() in tail, (template, head)


@pytest.mark.parametrize(
    "mark, words",
    [
        ({"type": "persistent"}, 'system[0].cache_control must be {"type": "ephemeral"}'),
        ("ephemeral", 'system[0].cache_control must be {"type": "ephemeral"}'),
        ({"type": "ephemeral", "ttl": "2h"}, "system[0].cache_control.ttl must be '5m' or '1h' (got '2h')"),
    ],
)
def test_a_malformed_mark_is_a_400_that_names_it(mark, words):
    engine = ScriptedEngine(["ok"])
    body = _body(
        [{"type": "text", "text": SYSTEM, "cache_control": mark}], [{"role": "user", "content": "hi"}]
    )
    with RunningServer(engine) as s:
        for route in ("/v1/messages", "/v1/messages/count_tokens"):
            r = httpx.post(f"{s.url}{route}", json=body, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(words), r.text
    assert engine.prompts == []


def test_more_than_four_marks_are_refused_counting_those_inside_a_tool_result():
    engine = ScriptedEngine(["ok", "ok"])
    inner = [_marked({"type": "text", "text": "out"}), _marked({"type": "text", "text": "more"})]
    result = _marked({"type": "tool_result", "tool_use_id": "t1", "content": inner})
    messages = [
        {"role": "user", "content": "Run it."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [result]},
    ]
    system = [_marked({"type": "text", "text": SYSTEM})]
    with RunningServer(engine) as s:
        r = httpx.post(f"{s.url}/v1/messages", json=_body(system, messages, [_marked(TOOLS[0])]), timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("at most 4 blocks may carry cache_control, and 5 do")
        r = httpx.post(f"{s.url}/v1/messages", json=_body(system, messages), timeout=30)
        assert r.status_code == 200, r.text  # 4 marks, one breakpoint at the tool_result
    # the tool list's (this template's turn opening) and the system prompt's; the tool_result's prefix is
    # the whole prompt (its end is kept anyway)
    assert len(engine.snapshot_hints[0]) == 2


def _tools_first_model(path, tokenizer):
    """A tiny random Qwen3.5 over `tokenizer`, its template writing the tools before the system prompt."""
    save_tiny(tiny_hf_model("qwen3_5", tied=False, vocab_size=tokenizer.vocab_size), path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    config = {"chat_template": TOOLS_FIRST, "eos_token": tokenizer.eos_token}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def _session(client, system: list[dict], tools: list[dict], protocol: str):
    """One turn of a new session: Anthropic's messages, or the same over OpenAI's chat completions."""
    ask = "Where is parse() defined?"
    if protocol == "anthropic":
        return client.messages.create(
            model="m",
            max_tokens=6,
            tools=tools,
            system=system,
            messages=[{"role": "user", "content": ask}],
            extra_body={"temperature": 0},
        )
    spec = [{"type": "function", "function": {**t, "parameters": t["input_schema"]}} for t in tools]
    for t in spec:
        t["function"].pop("input_schema"), t["function"].pop("cache_control", None)
    # the system blocks as content parts, their marks as OpenRouter takes them (the same text joined)
    parts = [
        {"type": "text", "text": ("\n\n" if i else "") + b["text"]}
        | ({"cache_control": b["cache_control"]} if "cache_control" in b else {})
        for i, b in enumerate(system)
    ]
    messages = [{"role": "system", "content": parts}, {"role": "user", "content": ask}]
    return client.chat.completions.create(
        model="m", max_tokens=6, tools=spec, messages=messages, temperature=0
    )


def _new_session_and_cold(path, system, protocol: str):
    """An agent's session (system("/home/ada")), then a new one (system("/home/bob")) on the same server,
    and the new one on a cold server: (its reply there, its cold reply)."""

    def client(s):
        if protocol == "anthropic":
            return anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        return openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)

    with RunningServer(AsyncLLM(path, block_size=16)) as s:
        _session(client(s), system("/home/ada"), TOOLS, protocol)
        second = _session(client(s), system("/home/bob"), TOOLS, protocol)
    with RunningServer(AsyncLLM(path, block_size=16)) as s:
        cold = _session(client(s), system("/home/bob"), TOOLS, protocol)
    return second, cold


def _cached(reply) -> int:
    usage = reply.usage
    return getattr(usage, "cache_read_input_tokens", None) or usage.prompt_tokens_details.cached_tokens


def _content(reply):
    return reply.content if hasattr(reply, "content") else reply.choices[0].message


def _prefix_tokens(tokenizer, system: list[dict], until: str) -> int:
    """The tokens of the TOOLS_FIRST prompt (TOOLS, `system`) up to the end of `until`'s last occurrence."""
    specs = [{"type": "function", "function": {**t, "parameters": t["input_schema"]}} for t in TOOLS]
    for spec in specs:
        del spec["function"]["input_schema"]
    messages = [
        {"role": "system", "content": "\n\n".join(b["text"] for b in system)},
        {"role": "user", "content": "x"},
    ]
    text = replace(tokenizer, chat_template=TOOLS_FIRST).apply_chat_template(messages, specs)
    return len(tokenizer.encode(text[: text.rindex(until) + len(until)], add_special_tokens=False))


@pytest.mark.parametrize("protocol", ["anthropic", "openai"])
def test_a_hybrid_resumes_a_new_session_after_the_tool_list(tmp_path, default_tokenizer, protocol):
    """Two sessions of one agent: the same tools, system prompts that differ from their first line (a
    working directory). The second reuses the tool list's pages and the recurrent state there, which its
    hint had snapshotted (short of the 4096-token interval; the turn points are past the system prompt,
    where the two differ). Its reply is what a cold engine gives."""
    path = _tools_first_model(tmp_path, default_tokenizer)

    def system(cwd: str) -> list[dict]:
        return [{"type": "text", "text": f"cwd: {cwd}\n{SYSTEM * 4}"}]

    second, cold = _new_session_and_cold(path, system, protocol)
    assert _content(second) == _content(cold)
    listed = _prefix_tokens(default_tokenizer, system("/home/bob"), "</tools>")
    assert listed > 64 and _cached(second) == listed // 16 * 16


@pytest.mark.parametrize("protocol", ["anthropic", "openai"])
@pytest.mark.parametrize("marked", [True, False])
def test_a_hybrid_resumes_at_a_mark_between_a_stable_head_and_a_per_session_tail(
    tmp_path, default_tokenizer, marked, protocol
):
    """System blocks (on chat completions, content parts): a long stable head, then a per-session tail.
    Marked, the head's end is a hint and a new session resumes there; unmarked, at the tool list's end.
    The reply is what a cold engine gives."""
    path = _tools_first_model(tmp_path, default_tokenizer)
    head = {"type": "text", "text": SYSTEM * 8}

    def system(cwd: str) -> list[dict]:
        return [_marked(head) if marked else head, {"type": "text", "text": f"cwd: {cwd}"}]

    second, cold = _new_session_and_cold(path, system, protocol)
    assert _content(second) == _content(cold)
    listed = _prefix_tokens(default_tokenizer, system("/home/bob"), "</tools>")
    stable = _prefix_tokens(default_tokenizer, system("/home/bob"), SYSTEM.strip())
    assert stable // 16 > listed // 16 + 1
    assert _cached(second) == (stable if marked else listed) // 16 * 16


def test_token_position_counts_the_tokens_within_a_text_prefix(default_tokenizer):
    """Byte-level BPE: exactly the tokens whose bytes end within the prefix (the tokens' byte lengths add up
    to the text's). Another tokenizer (a word-level one drops the spaces): the tokens the prefix encodes to
    that the prompt starts with, less the last (the cut may have split it): a token early at most."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from engine.api.snapshot_hints import token_position
    from engine.tokenizer import Tokenizer

    text = "<|im_start|>system\nnaïve café 日本語 tools<|im_end|>\n"
    ids = default_tokenizer.encode(text, add_special_tokens=False)
    pieces = [default_tokenizer.token_bytes(i) for i in ids]
    for k in range(len(ids) + 1):
        head = b"".join(pieces[:k])
        chars = len(head.decode("utf-8", errors="ignore"))  # (a token may end inside a character)
        position = token_position(text, ids, chars, default_tokenizer)
        assert position == k if len(text[:chars].encode()) == len(head) else position < k
    words = {w: i for i, w in enumerate(["[UNK]", "alpha", "beta", "gamma"])}
    backend = HFTokenizer(WordLevel(words, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    plain = Tokenizer(backend=backend)
    text = "alpha beta gamma"
    ids = plain.encode(text, add_special_tokens=False)
    assert [token_position(text, ids, n, plain) for n in (0, 5, 8, 11, 12, 16)] == [0, 0, 1, 1, 2, 2]


def test_metrics_say_the_snapshots_held_and_the_tokens_lost_for_want_of_one(tmp_path, default_tokenizer):
    """/metrics on a hybrid model: the snapshot slots, those held, the shared ones; with no snapshot slots
    the same prompt twice finds its KV pages cached but resumes nowhere, counted as lost tokens."""
    path = _tools_first_model(tmp_path, default_tokenizer)
    body = {"model": "m", "max_tokens": 2, "temperature": 0, "tools": _openai_tools()}
    body["messages"] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]

    def metric(text: str, name: str) -> float:
        return float(next(ln for ln in text.splitlines() if ln.startswith(name + " ")).split()[1])

    for snapshots in (4, 0):
        with RunningServer(AsyncLLM(path, block_size=16, state_snapshots=snapshots)) as s:
            for _ in range(2):
                r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=60)
                assert r.status_code == 200, r.text
            text = httpx.get(f"{s.url}/metrics", timeout=30).text
            cached = r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        assert metric(text, "ninfer_state_snapshots_total") == snapshots
        assert metric(text, "ninfer_host_state_snapshots_total") == 3 * snapshots  # (by default three times)
        if (
            snapshots
        ):  # shared: the tool list's end (not the user turn's start); the prompt's end, the reply's
            assert (
                metric(text, "ninfer_state_snapshots_shared") == 1
                and metric(text, "ninfer_state_snapshots_used") >= 2
            )
            assert cached > 0 and metric(text, "ninfer_prefix_cache_state_lost_tokens") < 16
        else:
            assert cached == 0 and metric(text, "ninfer_prefix_cache_state_lost_tokens") >= 64
    # one GPU slot: a second conversation's snapshots send the first's to the host tier
    with RunningServer(AsyncLLM(path, block_size=16, state_snapshots=1)) as s:
        for system in (SYSTEM, "You answer in French. " + SYSTEM):
            body["messages"][0]["content"] = system
            assert httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=60).status_code == 200
        text = httpx.get(f"{s.url}/metrics", timeout=30).text
    assert metric(text, "ninfer_host_state_snapshots_total") == 3
    assert 1 <= metric(text, "ninfer_host_state_snapshots_used") <= 3  # the first's, evicted


def _agent_then_subagent_run(path, sub_turns: int) -> list[tuple[int, int]]:
    """Over /v1/messages at one request, as Claude Code sends it (the system prompt and the last message
    marked): an agent's two turns, its subagent's `sub_turns` in a row (a system prompt of its own after the
    same tools), the agent's third: per turn (prompt tokens, cached tokens)."""

    def turn(client, system: list[dict], messages: list[dict]) -> tuple[int, int]:
        last = {
            "role": "user",
            "content": [{"type": "text", "text": messages[-1]["content"], "cache_control": MARK}],
        }
        reply = client.messages.create(
            model="m",
            max_tokens=6,
            tools=TOOLS,
            system=system,
            messages=[*messages[:-1], last],
            extra_body={"temperature": 0},
        )
        text = "".join(b.text for b in reply.content if b.type == "text") or "ok"
        result = f"result {len(messages)}: " + "lorem ipsum dolor " * 8
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": result}]
        return (
            reply.usage.input_tokens + reply.usage.cache_read_input_tokens,
            reply.usage.cache_read_input_tokens,
        )

    agent_system = [{"type": "text", "text": "cwd: /home/ada\n" + SYSTEM * 4, "cache_control": MARK}]
    sub_system = [{"type": "text", "text": "You are a search subagent. " * 6, "cache_control": MARK}]
    agent = [{"role": "user", "content": "Fix the bug in parse()."}]
    sub = [{"role": "user", "content": "Find where parse() is defined."}]
    engine = AsyncLLM(path, block_size=16, max_concurrency=1, host_state_snapshots=8)
    with RunningServer(engine) as s:
        client = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        rows = [turn(client, agent_system, agent) for _ in range(2)]
        rows += [turn(client, sub_system, sub) for _ in range(sub_turns)]
        return rows + [turn(client, agent_system, agent)]


def test_an_agent_resumes_where_it_stopped_after_its_subagents_run_of_turns(
    tmp_path, default_tokenizer, monkeypatch
):
    """The subagent's eight turns save more snapshots than the four GPU slots and eight host ones hold;
    each turn supersedes its turn before's, which go first, so the agent's third turn resumes at its
    second prompt's end. Under plain LRU order (superseding off) it resumes at the tool list."""
    path = _tools_first_model(tmp_path, default_tokenizer)
    rows = _agent_then_subagent_run(path, 8)
    (second, _), (_, resumed) = rows[1], rows[-1]
    assert resumed == second // 16 * 16
    monkeypatch.setattr(StatePool, "supersede", lambda self, owner, after, keep_shared=False: None)
    lru = _agent_then_subagent_run(path, 8)
    listed = _prefix_tokens(default_tokenizer, [{"type": "text", "text": "x"}], "</tools>")
    assert lru[-1][1] == listed // 16 * 16 < resumed
