"""OpenAI's `n` and the text completions' several prompts (official SDK, embedded model): one choice per
prompt and n, each as a request of its own would give it, streamed or not; a prompt computed once."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

QUESTION = [{"role": "user", "content": "Write a short sentence about the sea."}]


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_concurrency=4, max_pending=8)) as s:
        yield s


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def test_chat_n_choices_each_sample_as_alone(oai, server):
    before = server.engine.stats()["prefix_cache_hits"]
    r = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, n=3, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    # choice j samples as a request of its own with seed 7 + j
    alone = [
        oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, temperature=1.0, seed=7 + j)
        for j in range(3)
    ]
    assert [c.message.content for c in r.choices] == [a.choices[0].message.content for a in alone]
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    # the later choices took the prompt's pages from the first's (and so did the requests alone)
    assert server.engine.stats()["prefix_cache_hits"] > before
    greedy = oai.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, n=2, temperature=0)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_chat_n_streamed(oai, server):
    kwargs = dict(model="m", messages=QUESTION, max_tokens=10, n=2, temperature=1.0, seed=3)
    whole = oai.chat.completions.create(**kwargs)
    chunks = list(oai.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    texts, finishes = {0: "", 1: ""}, {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    server.wait_idle()


def test_completions_several_prompts_and_n(oai, server):
    prompts = ["The capital of France is", "One, two, three,"]
    ids = server.engine.tokenizer.encode(prompts[1])
    alone = [oai.completions.create(model="m", prompt=p, max_tokens=6, temperature=0) for p in prompts]
    for prompt in (prompts, [prompts[0], ids]):
        r = oai.completions.create(model="m", prompt=prompt, max_tokens=6, n=2, temperature=0)
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        # choice i answers prompt i // n
        assert [c.text for c in r.choices] == [a.choices[0].text for a in alone for _ in range(2)]
        assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    chunks = list(
        oai.completions.create(model="m", prompt=prompts, max_tokens=6, temperature=0, echo=True, stream=True)
    )
    texts = {0: "", 1: ""}
    for c in chunks:
        texts[c.choices[0].index] += c.choices[0].text
    assert chunks[-1].usage is None
    assert texts == {i: prompts[i] + a.choices[0].text for i, a in enumerate(alone)}
    # the usage chunk closes the stream when asked for: no choices, each prompt counted once
    chunks = list(
        oai.completions.create(
            model="m",
            prompt=prompts,
            max_tokens=6,
            n=2,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    assert chunks[-1].usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    server.wait_idle()


def test_lm_eval_harness_style_batch(oai, server):
    """What lm-eval's local-completions sends to score continuations: token-id prompts in one batch,
    echo, logprobs 1, max_tokens 1, temperature 0; it reads token_logprobs[ctxlen:-1] and whether each
    continuation token was the top one."""
    tok = server.engine.tokenizer
    context = tok.encode("The capital of France is")
    right, wrong = (
        tok.encode(" Paris", add_special_tokens=False),
        tok.encode(" pizza", add_special_tokens=False),
    )
    r = oai.completions.create(
        model="m",
        prompt=[context + right, context + wrong],
        max_tokens=1,
        logprobs=1,
        echo=True,
        temperature=0,
        seed=1234,
    )
    scores = []
    for choice, cont in zip(sorted(r.choices, key=lambda c: c.index), (right, wrong)):
        values = choice.logprobs.token_logprobs[len(context) : -1]
        tops = choice.logprobs.top_logprobs[len(context) : -1]
        assert len(values) == len(cont) == len(tops)
        scores.append((sum(values), all(v == max(t.values()) for v, t in zip(values, tops))))
    assert scores[0][0] > scores[1][0] and scores[0][1] and not scores[1][1]


@pytest.mark.parametrize(
    "path, extra, message",
    [
        ("/v1/chat/completions", {"n": 0}, "'n' must be at least 1"),
        ("/v1/chat/completions", {"n": 65}, "65 choices asked for"),
        ("/v1/completions", {"prompt": ["a", "b"], "n": 40}, "80 choices asked for (prompts x n)"),
        ("/v1/completions", {"prompt": ["a", 5]}, "'prompt' must be a string, an array of token ids"),
        ("/v1/completions", {"prompt": []}, "'prompt' must be a string"),
    ],
)
def test_bad_choices_are_one_line(server, path, extra, message):
    body = {"model": "m", "max_tokens": 2, "prompt": "hi", "messages": QUESTION, **extra}
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_more_choices_than_the_queue_holds_are_refused_whole(server):
    """4 running + 8 waiting: 13 choices get a 429, and none of them is left queued or running."""
    # long replies: none of the first twelve ends (and makes room) while the thirteenth is queued
    body = {"model": "m", "max_tokens": 300, "ignore_eos": True, "messages": QUESTION, "n": 13}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 429
    stats = server.wait_idle()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_a_client_leaving_a_streamed_n_frees_every_choice(server):
    body = {"model": "m", "max_tokens": 200, "messages": QUESTION, "n": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break  # one token of content in: hang up
    stats = server.wait_idle()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
