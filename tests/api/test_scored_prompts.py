"""Prompt log-probabilities over the OpenAI routes (official SDK, embedded model): the legacy completions'
echo with logprobs and max_tokens 0 (how lm-evaluation-harness scores a continuation), and vLLM's
prompt_logprobs on text and chat completions."""

from __future__ import annotations

import math

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

GREEDY = {"temperature": 0}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server():
    # weights dequantized: the CPU int4 kernels round a decode step and a prompt chunk differently (~1e-3),
    # and the first test compares the two
    with RunningServer(AsyncLLM(max_concurrency=2, weight_quant="none")) as s:
        yield s


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def test_a_scored_continuation_has_the_logprobs_it_was_generated_with(oai, server):
    """lm-eval's loglikelihood request: prompt + continuation as token ids, echo, logprobs, max_tokens 0.
    The continuation's prompt logprobs are those the model sampled it with."""
    ids = server.engine.tokenizer.encode(PROMPT)
    gen = oai.completions.create(model="m", prompt=ids, max_tokens=5, logprobs=2, **GREEDY).choices[0]
    cont = [server.engine.tokenizer.encode(t, add_special_tokens=False) for t in gen.logprobs.tokens]
    cont_ids = [i for piece in cont for i in piece]
    assert len(cont_ids) == 5
    scored = oai.completions.create(
        model="m", prompt=ids + cont_ids, max_tokens=0, echo=True, logprobs=2, **GREEDY
    )
    choice = scored.choices[0]
    assert choice.finish_reason == "length" and scored.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 5 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for got, want in zip(lp.token_logprobs[-5:], gen.logprobs.token_logprobs):
        assert math.isclose(got, want, abs_tol=1e-4)
    # greedy: each continuation token is its position's top alternative (lm-eval's is_greedy)
    for piece, alts in zip(lp.tokens[-5:], lp.top_logprobs[-5:]):
        assert max(alts, key=alts.get) == piece
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert choice.text == server.engine.tokenizer.decode(ids + cont_ids)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_echo_with_logprobs_generated_and_streamed(oai):
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=4, echo=True, logprobs=1, **GREEDY)
    lp, n_prompt = r.choices[0].logprobs, r.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 4 and r.choices[0].text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and all(v is not None for v in lp.token_logprobs[1:])
    # the generated tokens' offsets run on from the echoed prompt's text
    assert lp.text_offset[n_prompt] == len(PROMPT)
    chunks = list(
        oai.completions.create(
            model="m", prompt=PROMPT, max_tokens=4, echo=True, logprobs=1, stream=True, **GREEDY
        )
    )
    first = chunks[0].choices[0]
    assert first.text == PROMPT and len(first.logprobs.tokens) == n_prompt
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    values = [v for c in chunks for v in c.choices[0].logprobs.token_logprobs]
    assert tokens == lp.tokens
    assert values[0] is None and all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(values[1:], lp.token_logprobs[1:])
    )
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_max_tokens_zero_without_echo_and_streamed(oai):
    r = oai.completions.create(model="m", prompt=PROMPT, max_tokens=0, **GREEDY)
    assert (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) == ("", "length", 0)
    chunks = list(oai.completions.create(model="m", prompt=PROMPT, max_tokens=0, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    assert chunks[-1].choices[0].finish_reason == "length"


def test_vllm_prompt_logprobs_on_text_and_chat(oai, server):
    r = oai.completions.create(
        model="m", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 3}, **GREEDY
    )
    plp = r.choices[0].model_extra["prompt_logprobs"]
    ids = server.engine.tokenizer.encode(PROMPT)
    assert len(plp) == len(ids) and plp[0] is None
    for token, entry in zip(ids[1:], plp[1:]):
        assert str(token) in entry and 3 <= len(entry) <= 4
        assert {e["rank"] for t, e in entry.items() if t != str(token)} <= {1, 2, 3}
        mine = entry[str(token)]
        assert mine["rank"] >= 1 and mine["logprob"] <= 0 and isinstance(mine["decoded_token"], str)
        best = min(entry.values(), key=lambda e: e["rank"])
        assert best["rank"] == 1 and best["logprob"] >= mine["logprob"]
    chat = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body={"prompt_logprobs": 0},
        **GREEDY,
    )
    plp = chat.model_extra["prompt_logprobs"]
    assert len(plp) == chat.usage.prompt_tokens and plp[0] is None and all(len(e) == 1 for e in plp[1:])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_refused_when_streamed_or_out_of_range(server, path):
    base = {"model": "m", "max_tokens": 2}
    base |= {"prompt": PROMPT} if "chat" not in path else {"messages": [{"role": "user", "content": "Hi"}]}
    for extra, message in (
        ({"prompt_logprobs": 1, "stream": True}, "'prompt_logprobs' are not available with 'stream': true"),
        ({"prompt_logprobs": 21}, "prompt_logprobs must be between 0 and 20"),
    ):
        r = httpx.post(server.url + path, json={**base, **extra}, timeout=60)
        assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_the_tokenizer_routes_lm_eval_reads(server):
    """lm-eval's remote tokenizer: /tokenizer_info must name eos_token, /tokenize take add_special_tokens,
    /detokenize give the text back."""
    tok = server.engine.tokenizer
    info = httpx.get(f"{server.url}/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == tok.eos_token and info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == server.engine.llm.max_context
    r = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}, timeout=30)
    ids = r.json()["tokens"]
    assert ids == tok.encode(PROMPT, add_special_tokens=False)
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=30).json()
    assert back == {"prompt": PROMPT, "content": PROMPT}  # vLLM's field and llama-server's
    eos = tok.token_to_id(tok.eos_token)
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [eos]}).json()["prompt"] == tok.eos_token
    for bad in ({"tokens": "abc"}, {"tokens": [-1]}, {"tokens": [10**9]}, {}):
        r = httpx.post(f"{server.url}/detokenize", json=bad, timeout=30)
        assert r.status_code == 400 and "'tokens' must be an array" in r.json()["error"]["message"]
