"""The server through the official openai and anthropic SDKs, on the embedded default model."""

from __future__ import annotations

import re

import anthropic
import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

KEY = "test-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=4), api_key=KEY) as s:
        yield s


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def test_openai_chat_and_stream(oai, server):
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=24, **GREEDY)
    assert "Paris" in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    chunks = list(
        oai.chat.completions.create(
            model="smollm2",
            messages=QUESTION,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    models = oai.models.list().data
    assert [m.id for m in models] == ["smollm2"]
    assert models[0].model_extra["max_model_len"] == server.engine.llm.max_context


def test_the_model_card_says_what_is_served_in_anthropics_shape(server, claude):
    card = claude.beta.models.retrieve("smollm2")
    assert card.max_input_tokens == server.engine.llm.max_context and card.lifecycle == "active"
    caps = card.capabilities
    assert caps.context_management.compact_20260112.supported and caps.compaction.summarize.supported
    assert caps.structured_outputs.supported and not caps.server_tools.supported
    assert not caps.image_input.supported  # the embedded model has no vision tower
    assert not caps.thinking.supported and caps.thinking.types.disabled.supported  # SmolLM2 does not think


def test_openai_completions(oai):
    r = oai.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, **GREEDY)
    assert r.choices[0].text and r.usage.prompt_tokens == 5 or r.usage.prompt_tokens > 0


def test_openai_completions_echo_and_legacy_logprobs(oai):
    prompt = "The capital of France is"
    plain = oai.completions.create(model="smollm2", prompt=prompt, max_tokens=8, **GREEDY).choices[0].text
    echoed = oai.completions.create(model="smollm2", prompt=prompt, max_tokens=8, echo=True, **GREEDY)
    assert echoed.choices[0].text == prompt + plain
    streamed = oai.completions.create(
        model="smollm2", prompt=prompt, max_tokens=8, echo=True, stream=True, **GREEDY
    )
    assert "".join(c.choices[0].text for c in streamed) == prompt + plain
    r = oai.completions.create(model="smollm2", prompt=prompt, max_tokens=8, logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text == plain and len(lp.tokens) == r.usage.completion_tokens
    assert all(
        len(top) == 3 and max(top.values()) == chosen
        for top, chosen in zip(lp.top_logprobs, lp.token_logprobs)
    )
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = list(
        oai.completions.create(
            model="smollm2", prompt=prompt, max_tokens=8, logprobs=2, stream=True, **GREEDY
        )
    )
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens


def test_vllm_stop_token_ids_and_skip_special_tokens(oai, server):
    r = oai.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=12, logprobs=True, **GREEDY
    )
    tokens = [c.token for c in r.choices[0].logprobs.content]
    stop_id = server.engine.tokenizer.encode(tokens[2], add_special_tokens=False)[0]
    stopped = oai.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=12, extra_body={"stop_token_ids": [stop_id], **GREEDY}
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 3
    kept = oai.completions.create(
        model="smollm2",
        prompt="Hi",
        max_tokens=40,
        extra_body={"skip_special_tokens": False, "ignore_eos": True, **GREEDY},
    )
    assert kept.usage.completion_tokens == 40


def test_vllm_min_tokens_holds_off_the_end(oai):
    short = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=64, **GREEDY)
    n = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and n < 40  # the model ends its answer itself
    for stream in (False, True):
        body = {
            "model": "smollm2",
            "messages": QUESTION,
            "max_tokens": 64,
            "extra_body": {"min_tokens": n + 8},
        }
        if stream:
            chunks = list(
                oai.chat.completions.create(
                    **body, stream=True, stream_options={"include_usage": True}, **GREEDY
                )
            )
            used = chunks[-1].usage.completion_tokens
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            r = oai.chat.completions.create(**body, **GREEDY)
            used, text = r.usage.completion_tokens, r.choices[0].message.content
        assert used >= n + 8 and text.startswith(short.choices[0].message.content)


def test_anthropic_message_and_stream(claude):
    m = claude.messages.create(model="smollm2", max_tokens=24, messages=QUESTION, extra_body=GREEDY)
    assert m.content[0].type == "text" and "Paris" in m.content[0].text and m.stop_reason == "end_turn"
    with claude.messages.stream(
        model="smollm2", max_tokens=24, messages=QUESTION, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text and final.usage.output_tokens == m.usage.output_tokens


def test_anthropic_event_order(server):
    body = {"model": "smollm2", "max_tokens": 8, "messages": QUESTION, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server.url}/v1/messages", json=body, headers={"x-api-key": KEY}) as r:
        kinds = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_stop_sequences_and_max_tokens(claude):
    m = claude.messages.create(model="smollm2", max_tokens=3, messages=QUESTION, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    m = claude.messages.create(
        model="smollm2", max_tokens=24, messages=QUESTION, stop_sequences=["France"], extra_body=GREEDY
    )
    assert (
        m.stop_reason == "stop_sequence" and m.stop_sequence == "France" and "France" not in m.content[0].text
    )


def test_count_tokens_equals_the_engines_count(claude, server):
    counted = claude.messages.count_tokens(model="smollm2", messages=QUESTION, system="Be brief.")
    ids = server.engine.tokenizer.encode_chat([{"role": "system", "content": "Be brief."}, *QUESTION])
    assert counted.input_tokens == len(ids)


def test_tokenize_counts_as_chat_completions_does_and_ignore_eos(oai, server):
    r = httpx.post(
        f"{server.url}/tokenize", json={"messages": QUESTION}, headers={"x-api-key": KEY}, timeout=30
    )
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == len(body["tokens"]) == len(server.engine.tokenizer.encode_chat(QUESTION))
    assert body["max_model_len"] == server.engine.llm.max_context
    chat = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=1, **GREEDY)
    assert chat.usage.prompt_tokens == body["count"]
    plain = httpx.post(f"{server.url}/tokenize", json={"prompt": "hello world"}, headers={"x-api-key": KEY})
    assert plain.json()["count"] == len(server.engine.tokenizer.encode("hello world"))
    assert httpx.post(f"{server.url}/tokenize", json={}, headers={"x-api-key": KEY}).status_code == 400
    # llama-server's shapes: `content` (no special tokens unless add_special), pieces, `content` back
    hdr = {"x-api-key": KEY}
    llama = httpx.post(
        f"{server.url}/tokenize", json={"content": "hello world", "with_pieces": True}, headers=hdr
    )
    pieces = llama.json()["tokens"]
    assert [p["id"] for p in pieces] == server.engine.tokenizer.encode(
        "hello world", add_special_tokens=False
    )
    assert "".join(p["piece"] for p in pieces) == "hello world"
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": [p["id"] for p in pieces]}, headers=hdr)
    assert back.json()["content"] == back.json()["prompt"] == "hello world"
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "x"}).status_code == 401  # the key guards it
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [1]}).status_code == 401
    assert httpx.get(f"{server.url}/tokenizer_info").status_code == 401
    # the short answer ends with EOS well before 40 tokens; ignore_eos runs all 40
    short = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=40, **GREEDY)
    assert short.usage.completion_tokens < 40
    full = oai.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=40, extra_body={"ignore_eos": True}, **GREEDY
    )
    assert full.usage.completion_tokens == 40


def test_repeated_long_prefix_reports_cached_tokens(oai, claude):
    system = "You are a careful assistant. " * 40  # ~240 tokens shared by both calls
    for prompt in ("Name a color.", "Name a fruit."):
        r = oai.chat.completions.create(
            model="smollm2",
            max_tokens=4,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            **GREEDY,
        )
    assert r.usage.prompt_tokens_details.cached_tokens >= 200
    for prompt in ("Name a city.", "Name a river."):
        m = claude.messages.create(
            model="smollm2",
            max_tokens=4,
            system=system,
            messages=[{"role": "user", "content": prompt}],
            extra_body=GREEDY,
        )
    assert m.usage.cache_read_input_tokens >= 200


def test_auth_in_both_shapes(server):
    bad_oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_oai.models.list()
    bad_claude = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad_claude.messages.create(model="x", max_tokens=5, messages=QUESTION)
    assert e.value.body["error"]["type"] == "authentication_error"
    none = httpx.post(f"{server.url}/v1/messages", json={})
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error"
    none = httpx.get(f"{server.url}/v1/models")
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error"
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        assert httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 200


def test_health_and_metrics(server):
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "ninfer_requests_running",
        "ninfer_kv_pages_used",
        "ninfer_time_to_first_token_seconds",
        "ninfer_prefix_cache_hit_tokens_total",
    ):
        assert name in text
    llm = server.engine.llm
    info = dict(
        re.findall(r'(\w+)="([^"]*)"', re.search(r"^ninfer_engine_info\{(.*)\} 1\.0$", text, re.M)[1])
    )
    assert info["kv_dtype"] == llm.runner.kv_caches[0].kv_dtype == "fp32" and info["cuda_graphs"] == "off"
    assert info["max_context"] == str(llm.max_context) and info["spec"] == "none" and info["device"] == "cpu"
    assert int(info["kv_pool_tokens"]) == llm.scheduler.block_pool.num_blocks * llm.engine_config.block_size


def test_llama_server_spellings_version_ping_and_apply_template(server):
    """llama-server's paths without /v1 are the same routes (behind the key as theirs are), /version and
    /ping as vLLM answers them, /apply-template the prompt chat completions would run."""
    key = {"Authorization": f"Bearer {KEY}"}
    body = {"messages": QUESTION, "max_tokens": 8, **GREEDY}
    v1 = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=key, timeout=60).json()
    bare = httpx.post(f"{server.url}/chat/completions", json=body, headers=key, timeout=60).json()
    assert bare["choices"][0]["message"] == v1["choices"][0]["message"]
    assert httpx.post(f"{server.url}/chat/completions", json=body, timeout=60).status_code == 401
    text = httpx.post(
        f"{server.url}/completions", json={"prompt": "The capital of France is", "max_tokens": 4}, headers=key
    )
    assert text.status_code == 200 and text.json()["object"] == "text_completion"
    assert httpx.get(f"{server.url}/models", headers=key).json()["data"][0]["id"] == server.state.model_id
    assert httpx.get(f"{server.url}/models/{server.state.model_id}", headers=key).status_code == 200
    assert httpx.get(f"{server.url}/v1/health").json()["status"] == "ok"
    from engine.version import ninfer_version

    assert httpx.get(f"{server.url}/version").json() == {"version": ninfer_version()}
    assert (
        httpx.get(f"{server.url}/ping").status_code == 200
        and httpx.post(f"{server.url}/ping").status_code == 200
    )
    rendered = httpx.post(f"{server.url}/apply-template", json={"messages": QUESTION}, headers=key).json()
    counted = httpx.post(f"{server.url}/tokenize", json={"messages": QUESTION}, headers=key).json()
    assert (
        rendered["prompt"].endswith("<|im_start|>assistant\n") and "capital of France" in rendered["prompt"]
    )
    assert server.engine.tokenizer.encode(rendered["prompt"], add_special_tokens=False) == counted["tokens"]
    refused = httpx.post(f"{server.url}/apply-template", json={"prompt": "hi"}, headers=key)
    assert refused.status_code == 400 and "send 'messages'" in refused.json()["error"]["message"]
    assert httpx.post(f"{server.url}/apply-template", json={"messages": QUESTION}).status_code == 401
    for path in ("/embedding", "/embeddings"):  # llama-server's own embeddings routes, behind the key too
        assert httpx.post(f"{server.url}{path}", json={"content": "hi"}, timeout=60).status_code == 401
        assert httpx.post(f"{server.url}{path}", json={"input": "hi"}, timeout=60).status_code == 401
        r = httpx.post(f"{server.url}{path}", json={"content": "hi"}, headers=key, timeout=60)
        assert r.status_code == 200 and r.json()[0]["index"] == 0


def test_preemptions_are_counted_in_metrics():
    """Two requests that outgrow a four-page pool together: one is preempted, and /metrics says so."""
    import threading

    with RunningServer(AsyncLLM(max_concurrency=2, kv_capacity=64, max_context=64)) as s:
        body = {"prompt": "The capital of France is", "max_tokens": 40, "ignore_eos": True, "temperature": 0}

        replies = []
        threads = [
            threading.Thread(
                target=lambda: replies.append(httpx.post(f"{s.url}/v1/completions", json=body, timeout=120))
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.json()["usage"]["completion_tokens"] for r in replies] == [40, 40]
        text = httpx.get(f"{s.url}/metrics").text
        preempted = float(re.search(r"^ninfer_preemptions (\S+)$", text, re.M)[1])
        assert preempted == s.engine.stats()["num_preemptions"] > 0


def test_openai_logprobs_plain_and_streamed(oai):
    kwargs = dict(model="smollm2", messages=QUESTION, max_tokens=6, logprobs=True, top_logprobs=2, **GREEDY)
    r = oai.chat.completions.create(**kwargs)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)  # greedy: the top token
    chunks = list(oai.chat.completions.create(stream=True, **kwargs))
    streamed = [
        item for c in chunks if c.choices and c.choices[0].logprobs for item in c.choices[0].logprobs.content
    ]
    assert [item.token for item in streamed] == [item.token for item in content]


def test_anthropic_beta_query_and_headers_are_tolerated(server):
    r = httpx.post(
        f"{server.url}/v1/messages?beta=true",
        headers={
            "x-api-key": KEY,
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "prompt-caching-2024-07-31",
        },
        json={"model": "smollm2", "max_tokens": 4, "messages": QUESTION},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_openai_logit_bias_bans_tokens(oai, server):
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8, logprobs=True, **GREEDY)
    first = server.engine.tokenizer.encode(r.choices[0].logprobs.content[0].token, add_special_tokens=False)
    banned = oai.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=8, logit_bias={str(first[0]): -100}, **GREEDY
    )
    assert banned.choices[0].message.content != r.choices[0].message.content


def test_anthropic_prefill_is_continued_on_the_real_template(claude, server):
    turns = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    m = claude.messages.create(model="smollm2", max_tokens=8, messages=turns, extra_body=GREEDY)
    assert m.content[0].text.lstrip().startswith("Paris")
    counted = claude.messages.count_tokens(model="smollm2", messages=turns)
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    text = server.engine.tokenizer.apply_chat_template(turns, None, False)
    assert text.index("The capital of France is") + len("The capital of France is") < len(text)  # closed turn


def test_both_sdks_list_and_retrieve_the_served_model(oai, claude, server):
    listed = oai.models.list().data
    assert [m.id for m in listed] == ["smollm2"] and listed[0].owned_by == "ninfer"
    assert oai.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(openai.NotFoundError, match="no model 'gpt-4' here; this server serves 'smollm2'"):
        oai.models.retrieve("gpt-4")
    page = claude.models.list()
    assert [m.id for m in page.data] == ["smollm2"] and page.data[0].type == "model"
    assert page.data[0].display_name == "smollm2" and page.data[0].created_at.year >= 2026
    assert claude.models.retrieve("smollm2").id == "smollm2"


def test_bad_words_keep_a_word_out_of_the_reply(oai, server):
    """vLLM's bad_words on the OpenAI routes: the greedy reply's first word, banned, is not its first word."""
    prompt = "The capital of France is"
    first = oai.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0).choices[0].text
    word = first.split()[0]
    banned = oai.completions.create(
        model="m", prompt=prompt, max_tokens=6, temperature=0, extra_body={"bad_words": [word]}
    )
    assert not banned.choices[0].text.lstrip().startswith(word), (first, banned.choices[0].text)
    chat = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
        extra_body={"bad_words": ["Hello", "hello"]},
    )
    assert "hello" not in chat.choices[0].message.content.lower()


def test_include_stop_str_in_output_keeps_the_stop_string(oai):
    """vLLM's include_stop_str_in_output: the reply ends with the stop string that ended it (streamed too)."""
    prompt = "The capital of France is"
    free = oai.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    stop = free.split()[1]  # the reply's second word
    cut = oai.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    kept = oai.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == cut.choices[0].text + stop and kept.choices[0].finish_reason == "stop"
    streamed = oai.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stop=[stop],
        stream=True,
        extra_body={"include_stop_str_in_output": True},
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == kept.choices[0].text


def _stream_chunks(server, route: str, body: dict) -> list[dict]:
    import json

    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{server.url}{route}", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/chat/completions", {"messages": QUESTION, "n": 2}),
        ("/v1/completions", {"prompt": ["The capital of France is", "One, two,"], "n": 2}),
    ],
)
def test_stream_options_usage_at_the_end_or_on_every_chunk(server, route, body):
    """include_usage: a last chunk with the totals and no choices, "usage": null on every other (OpenAI);
    with vLLM's continuous_usage_stats, every chunk carries the usage so far, rising to the totals."""
    body = {**body, "max_tokens": 8, "stream": True, **GREEDY}
    plain = _stream_chunks(server, route, body)
    assert all("usage" not in c for c in plain)
    at_end = _stream_chunks(server, route, {**body, "stream_options": {"include_usage": True}})
    totals = at_end[-1]["usage"]
    assert (
        at_end[-1]["choices"] == [] and totals["completion_tokens"] > 8
    )  # several choices of up to 8 tokens
    assert all(c["usage"] is None for c in at_end[:-1])
    options = {"include_usage": True, "continuous_usage_stats": True}
    running = _stream_chunks(server, route, {**body, "stream_options": options})
    assert running[-1]["usage"] == totals
    counts = [c["usage"]["completion_tokens"] for c in running[:-1]]
    assert counts == sorted(counts) and counts[-1] == totals["completion_tokens"]
    assert all(c["usage"]["prompt_tokens"] == totals["prompt_tokens"] for c in running)
    assert all(c["usage"]["total_tokens"] == totals["prompt_tokens"] + n for c, n in zip(running, counts))
    # without include_usage, continuous stats add nothing (as vLLM has it)
    alone = _stream_chunks(server, route, {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in c for c in alone)


def test_stream_options_are_checked(oai):
    for options, words in (
        ({"include_usage": "yes"}, "'include_usage' must be a boolean"),
        ({"continuous_usage_stats": 1}, "'continuous_usage_stats' must be a boolean"),
        ("usage", "'stream_options' must be an object"),
    ):
        with pytest.raises(openai.BadRequestError, match=words):
            oai.chat.completions.create(
                model="m",
                messages=QUESTION,
                max_tokens=2,
                stream=True,
                extra_body={"stream_options": options},
            )
    for create, kwargs in (
        (oai.chat.completions.create, {"messages": QUESTION}),
        (oai.completions.create, {"prompt": "hi"}),
    ):
        with pytest.raises(openai.BadRequestError, match="'stream_options' goes with \"stream\": true"):
            create(model="m", max_tokens=2, stream_options={"include_usage": True}, **kwargs)


def test_a_length_stop_inside_a_character_sends_a_replacement_character(oai, server):
    """The emoji is two tokens; three tokens end with half of the second one, sent as U+FFFD (llama-server's
    way), streamed or not, its logprobs' bytes still the token's own."""
    kwargs = dict(model="m", messages=QUESTION, max_tokens=3, logprobs=True, **GREEDY)
    body = dict(**kwargs, extra_body={"guided_regex": "🙂{4}"})
    reply = oai.chat.completions.create(**body).choices[0]
    assert (reply.message.content, reply.finish_reason) == ("🙂\ufffd", "length")
    assert b"".join(bytes(item.bytes) for item in reply.logprobs.content) == "🙂".encode() + "🙂".encode()[:2]
    chunks = list(oai.chat.completions.create(stream=True, **body))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "🙂\ufffd"


def test_logprobs_carry_each_tokens_bytes_and_names_by_id_on_request(oai, server):
    """Chat logprobs give each token's raw bytes (OpenAI's `bytes`): a token holding part of a character
    reads as U+FFFD, and the bytes joined are the reply. vLLM's return_tokens_as_token_ids names tokens
    `token_id:N` in chat and text completions (and in the echoed prompt's logprobs)."""
    reply = "Sí: 😀 日本語"
    kwargs = dict(model="m", messages=QUESTION, max_tokens=32, logprobs=True, top_logprobs=2, **GREEDY)
    for stream in (False, True):
        body = dict(**kwargs, extra_body={"guided_choice": [reply]})
        if stream:
            chunks = oai.chat.completions.create(stream=True, **body)
            content = [
                i
                for c in chunks
                if c.choices and c.choices[0].logprobs
                for i in c.choices[0].logprobs.content
            ]
        else:
            content = oai.chat.completions.create(**body).choices[0].logprobs.content
        assert b"".join(bytes(item.bytes) for item in content).decode() == reply
        assert any("\ufffd" in item.token for item in content)  # a part of a character, told by its bytes
        for item in content:
            assert all(bytes(alt.bytes).decode("utf-8", "replace") == alt.token for alt in item.top_logprobs)
    tok = server.engine.llm.tokenizer
    by_id = oai.chat.completions.create(**kwargs, extra_body={"return_tokens_as_token_ids": True})
    named = by_id.choices[0].logprobs.content
    assert all(item.token.startswith("token_id:") for item in named)
    ids = [int(item.token.removeprefix("token_id:")) for item in named]
    assert tok.decode(ids) == by_id.choices[0].message.content
    assert all(alt.token.startswith("token_id:") for item in named for alt in item.top_logprobs)
    prompt = "The capital of France is"
    text = oai.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=4,
        logprobs=2,
        echo=True,
        temperature=0,
        extra_body={"return_tokens_as_token_ids": True},
    ).choices[0]
    ids = [int(t.removeprefix("token_id:")) for t in text.logprobs.tokens]
    assert tok.decode(ids) == text.text
    assert text.logprobs.text_offset[-1] == len(text.text) - len(tok.decode(ids[-1:]))
    assert all(k.startswith("token_id:") for alts in text.logprobs.top_logprobs[1:] for k in alts)
    with pytest.raises(openai.BadRequestError, match="'return_tokens_as_token_ids' must be a boolean"):
        oai.completions.create(
            model="m",
            prompt=prompt,
            max_tokens=1,
            logprobs=1,
            extra_body={"return_tokens_as_token_ids": "yes"},
        )


def test_reset_prefix_cache_makes_the_next_prompt_cold(server, oai):
    """vLLM's POST /reset_prefix_cache (behind the key): a prompt served from the cache before is computed
    again after it; /lora-adapters is behind the key too."""
    long_question = [{"role": "user", "content": "Describe the river Seine in Paris. " * 12}]

    def cached() -> int:
        r = oai.chat.completions.create(model="smollm2", messages=long_question, max_tokens=2, **GREEDY)
        return r.usage.prompt_tokens_details.cached_tokens

    cached()
    assert cached() > 0
    assert httpx.post(f"{server.url}/reset_prefix_cache").status_code == 401
    assert httpx.get(f"{server.url}/lora-adapters").status_code == 401
    r = httpx.post(f"{server.url}/reset_prefix_cache", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    assert cached() == 0
    assert cached() > 0  # and it caches again
