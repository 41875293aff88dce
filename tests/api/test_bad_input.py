"""Malformed requests: each gets a 4xx in its protocol's error shape; the server keeps serving; nothing leaks."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

OK_MSG = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS, MESSAGES, COUNT = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
)


def chat(**kw):
    return {"model": "m", "messages": OK_MSG, "max_tokens": 4, **kw}


def msg(**kw):
    return {"model": "m", "max_tokens": 4, "messages": OK_MSG, **kw}


def without(body, key):
    return {k: v for k, v in body.items() if k != key}


LONG_TEXT = "word " * 9000  # far beyond the server's 2048-token context

CASES = [
    (CHAT, without(chat(), "messages")),
    (CHAT, chat(messages="hi")),
    (CHAT, chat(messages=[])),
    (CHAT, chat(messages=[1])),
    (CHAT, chat(messages=[{"role": "wizard", "content": "hi"}])),
    (CHAT, chat(messages=[{"content": "hi"}])),
    (CHAT, chat(messages=[{"role": "user", "content": 123}])),
    (CHAT, chat(messages=[{"role": "user", "content": [{"text": "no type"}]}])),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "video", "url": "x"}]}])),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])),
    (CHAT, chat(max_tokens=-5)),
    (CHAT, chat(max_tokens=0)),
    (CHAT, chat(max_tokens="ten")),
    (CHAT, chat(max_tokens=10**12)),
    (CHAT, chat(max_tokens=True)),
    (CHAT, chat(temperature=-1)),
    (CHAT, chat(temperature="hot")),
    (CHAT, chat(top_p=0)),
    (CHAT, chat(top_p=1.5)),
    (CHAT, chat(n=0)),
    (CHAT, chat(n=65)),
    (CHAT, chat(n="two")),
    (CHAT, chat(stop=123)),
    (CHAT, chat(stop=["ok", 5])),
    (CHAT, chat(stream="yes")),
    (CHAT, chat(logprobs="true")),
    (CHAT, chat(logprobs=True, top_logprobs=50)),
    (CHAT, chat(tools="calculator")),
    (CHAT, chat(chat_template_kwargs="thinking")),
    (CHAT, chat(messages=[{"role": "user", "content": LONG_TEXT}])),
    (CHAT, chat(seed="lucky")),
    (
        CHAT,
        chat(
            messages=[
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}],
                }
            ]
        ),
    ),
    (CHAT, chat(presence_penalty=5)),
    (CHAT, chat(logit_bias={"hello": 5})),
    (CHAT, chat(logit_bias={"5": 500})),
    (CHAT, chat(logit_bias={"999999": 1})),
    (CHAT, chat(logit_bias=[1, 2])),
    (CHAT, chat(functions=[{"name": "f", "parameters": {}}])),
    (CHAT, chat(function_call="auto")),
    (CHAT, chat(min_tokens=-1)),
    (CHAT, chat(min_tokens=99, max_tokens=8)),
    (CHAT, chat(min_tokens=4, response_format={"type": "json_object"})),
    (CHAT, chat(include_stop_str_in_output="yes")),
    (CHAT, chat(stop_token_ids=["x"])),
    (CHAT, chat(guided_choice=1.5)),
    (CHAT, chat(guided_choice="yes")),  # a string, not a list of them
    (CHAT, chat(guided_grammar="")),
    (CHAT, chat(tools=[1])),  # each of these was a 500 after the reply was generated
    (CHAT, chat(tools=[{"type": "function", "function": {"description": "no name"}}])),
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}])),
    (CHAT, chat(tools=[{"type": "web_search"}])),
    (CHAT, chat(tools=[{"type": "custom", "custom": {"name": "f", "format": {"type": "grammar"}}}])),
    (CHAT, chat(tools=[{"type": "custom", "custom": "f"}])),
    (CHAT, chat(prediction={"type": "content", "content": None})),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "suffix": "bye"}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "best_of": 3}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "allowed_token_ids": []}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "allowed_token_ids": [10**9]}),
    (CHAT, chat(allowed_token_ids="all")),
    (CHAT, chat(bad_words="damn")),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "bad_words": ["ok", ""]}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "max_tokens": -1}),
    (COMPLETIONS, {"model": "m", "prompt": "hi", "logprobs": 99}),
    (COMPLETIONS, {"model": "m", "max_tokens": 4}),
    (COMPLETIONS, {"model": "m", "prompt": 42}),
    (COMPLETIONS, {"model": "m", "prompt": ["one", 2]}),
    (COMPLETIONS, {"model": "m", "prompt": [[1, 2], []]}),
    (COMPLETIONS, {"model": "m", "prompt": [1, 2, 10**9]}),
    (MESSAGES, without(msg(), "max_tokens")),
    (MESSAGES, without(msg(), "model")),
    (MESSAGES, without(msg(), "messages")),
    (MESSAGES, msg(messages=[{"role": "tool", "content": "hi"}])),  # (system: a mid-conversation one, taken)
    (MESSAGES, msg(messages=[{"role": "user", "content": [{"text": "no type"}]}])),
    (MESSAGES, msg(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])),
    (
        MESSAGES,
        msg(messages=[{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]),
    ),
    (MESSAGES, msg(system=5)),
    (MESSAGES, msg(thinking={"type": "maybe"})),
    (MESSAGES, msg(stop_sequences=[1, 2])),
    (MESSAGES, msg(max_tokens=-1)),  # (0 pre-warms the prompt cache: tests/api/test_anthropic_prewarm.py)
    (MESSAGES, msg(messages=[{"role": "user", "content": LONG_TEXT}])),
    (MESSAGES, msg(top_k="many")),
    (MESSAGES, msg(tools=[{"name": "f", "input_schema": 5}])),
    (COUNT, {"model": "m"}),
]


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=2, max_context=2048)) as s:
        yield s


def _assert_shape(path: str, r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:300])
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], body
    else:
        assert body["error"]["message"] and body["error"]["type"], body


@pytest.mark.parametrize(
    "path,body", CASES, ids=[f"{i}-{p.split('/')[-1]}" for i, (p, _) in enumerate(CASES)]
)
def test_malformed_json_requests(server, path, body):
    _assert_shape(path, httpx.post(server.url + path, json=body, timeout=60))


@pytest.mark.parametrize("path", [CHAT, MESSAGES])
def test_malformed_bodies(server, path):
    url = server.url + path
    cases = [
        (b"{not json", {"content-type": "application/json"}),
        (b'{"model": "m", "messages": "\xff\xfe"}', {"content-type": "application/json"}),
        (b"[1, 2, 3]", {"content-type": "application/json"}),
        (b'{"model": "m"}', {"content-type": "text/plain"}),
        # NaN / Infinity parse as JSON numbers in Python; sampling must refuse them
        (
            b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            {"content-type": "application/json"},
        ),
        (
            b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
            {"content-type": "application/json"},
        ),
        (b"{" + b" " * (20 * 1024 * 1024) + b"}", {"content-type": "application/json"}),
    ]
    for raw, headers in cases:
        _assert_shape(path, httpx.post(url, content=raw, headers=headers, timeout=60))


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities"),
        ({"modalities": "text"}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"use_beam_search": True}, "use_beam_search"),
    ],
)
def test_a_reply_that_cannot_be_text_alone_is_refused_not_cut_down(server, extra, param):
    """Spoken audio, OpenAI's web search and vLLM's beam search are refused in a sentence, not answered with
    a plain sampled text."""
    r = httpx.post(server.url + CHAT, json=chat(**extra), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "\n" not in r.json()["error"]["message"]
    assert httpx.post(server.url + CHAT, json=chat(modalities=["text"]), timeout=60).status_code == 200


def test_unknown_endpoint_and_method(server):
    _assert_shape("/v1/nothing", httpx.post(server.url + "/v1/nothing", json={}))
    _assert_shape(CHAT, httpx.get(server.url + CHAT))


def test_still_serving_and_nothing_leaked(server):
    r = httpx.post(server.url + CHAT, json=chat(max_tokens=3), timeout=60)
    assert r.status_code == 200
    stats = server.engine.stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_a_prompt_beyond_the_context_is_worded_as_each_protocols_clients_detect(server):
    """OpenAI clients (litellm, aider, LangChain) look for "This model's maximum context length is" and the
    code context_length_exceeded; Claude Code, Anthropic's own "prompt is too long"."""
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    long = [{"role": "user", "content": LONG_TEXT}]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="m", messages=long, max_tokens=4)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith(
        "This model's maximum context length is 2048 tokens, but the prompt is "
    )
    assert error["message"].endswith("; shorten the conversation or raise --max-context")
    with pytest.raises(openai.BadRequestError, match="maximum context length is 2048"):
        oai.completions.create(model="m", prompt=LONG_TEXT, max_tokens=4)
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="m", messages=long, max_tokens=4)
    message = caught.value.body["error"]["message"]
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert message.startswith("prompt is too long: ") and " tokens > 2048 maximum; " in message


def test_the_engines_own_count_is_worded_the_same(monkeypatch):
    """With images the engine counts the prompt (each picture's tokens): its refusal reads the same."""
    from scripted_engine import ScriptedEngine

    from engine.errors import PromptTooLong

    engine = ScriptedEngine([])

    async def too_long(*args, **kwargs):
        raise PromptTooLong(
            "the prompt is 5000 tokens but the context limit is 4096 (max_context)", 5000, 4096
        )

    monkeypatch.setattr(engine, "add_request", too_long)
    with RunningServer(engine) as s:
        r = httpx.post(s.url + CHAT, json=chat(), timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["message"].startswith("This model's maximum context length is 4096 tokens")
        r = httpx.post(s.url + MESSAGES, json=msg(), timeout=60)
        assert r.json()["error"]["message"].startswith("prompt is too long: 5000 tokens > 4096 maximum")


def test_truncate_prompt_tokens_keeps_the_prompts_end(server):
    """vLLM's truncate_prompt_tokens: N keeps the last N prompt tokens; -1 as many as leave room for
    max_tokens; 0 is refused."""
    long = [{"role": "user", "content": LONG_TEXT}]
    r = httpx.post(server.url + CHAT, json=chat(messages=long, truncate_prompt_tokens=-1), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 2048 - 4
    body = {"model": "m", "prompt": LONG_TEXT, "max_tokens": 2, "truncate_prompt_tokens": 10}
    r = httpx.post(server.url + COMPLETIONS, json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 10
    r = httpx.post(server.url + COMPLETIONS, json={**body, "truncate_prompt_tokens": 0}, timeout=60)
    assert r.status_code == 400 and "'truncate_prompt_tokens' must be -1" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", [CHAT, MESSAGES, COUNT, "/v1/responses"])
def test_an_image_to_a_text_only_model_says_how_to_take_images(server, path):
    """The default model's chat template renders text alone: an image part is refused with the way to take
    images, not with the template's own failure on a list."""
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    if path == CHAT:
        part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    elif path == "/v1/responses":
        part = {"type": "input_image", "image_url": f"data:image/png;base64,{png}"}
    else:
        part = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    text = {"type": "input_text" if path == "/v1/responses" else "text", "text": "What is this?"}
    turn = [{"role": "user", "content": [text, part]}]
    body = {"model": "m", "input": turn} if path == "/v1/responses" else msg(messages=turn)
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "runs without the vision tower, so it takes no images; start it with --vision" in r.text, r.text
    assert "chat template" not in r.text
