"""A server run with n-gram speculative decoding: streamed replies equal plain decoding's, and /metrics
counts drafted and accepted tokens."""

from __future__ import annotations

import re

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

CODE = "def area(width, height):\n    return width * height\n"
COPY = [{"role": "user", "content": f"Repeat this code exactly, with nothing else:\n\n{CODE}"}]


def _metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[1])


@pytest.fixture(scope="module")
def servers():
    with (
        RunningServer(AsyncLLM(max_concurrency=2)) as plain,
        RunningServer(AsyncLLM(max_concurrency=2, spec="ngram", draft_tokens=4)) as spec,
    ):
        yield plain, spec


def test_streamed_reply_with_drafts_equals_plain_and_metrics_count_them(servers):
    texts = []
    for s in servers:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(
            model="smollm2", messages=COPY, max_tokens=32, temperature=0, stream=True
        )
        texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    assert texts[0] == texts[1] and "return width * height" in texts[1]
    metrics = httpx.get(f"{servers[1].url}/metrics").text
    drafted = _metric(metrics, "ninfer_spec_draft_tokens_total")
    accepted = _metric(metrics, "ninfer_spec_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted
    assert _metric(metrics, "ninfer_spec_acceptance_rate") == pytest.approx(accepted / drafted)
    # vLLM's names for the same counts, and its verifications: at most 4 draft tokens each (--draft-tokens)
    vllm = {
        name: float(re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)[1])
        for name in (
            "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total",
            "vllm:spec_decode_num_drafts_total",
        )
    }
    assert vllm["vllm:spec_decode_num_draft_tokens_total"] == drafted
    assert vllm["vllm:spec_decode_num_accepted_tokens_total"] == accepted
    assert drafted / 4 <= vllm["vllm:spec_decode_num_drafts_total"] <= drafted
    assert _metric(httpx.get(f"{servers[0].url}/metrics").text, "ninfer_spec_draft_tokens_total") == 0


def test_bench_over_http_reads_the_acceptance_from_metrics(servers):
    """`ninfer bench --url` takes a run's draft acceptance from the server's /metrics counters where it
    exports them (ninfer with --spec), and leaves it empty elsewhere."""
    from engine.bench.drivers import OverHttp
    from engine.bench.workloads import Prompt

    prompt = Prompt(COPY, None, 0, "")
    plain, spec = (OverHttp(s.url, model="smollm2").run([prompt], 24)[0] for s in servers)
    assert plain.spec_acceptance is None and plain.generated == 24
    assert spec.spec_acceptance is not None and 0 < spec.spec_acceptance <= 1


def test_predicted_outputs_draft_and_are_counted_in_usage(servers):
    """OpenAI's `prediction`: the reply equals the plain server's; usage counts the prediction's drafts
    accepted and rejected (the spec server), zero where nothing drafts (the plain one); a malformed one is
    a 400 naming the field."""
    prediction = {"type": "content", "content": [{"type": "text", "text": CODE}]}
    replies = []
    for s in servers:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="smollm2", messages=COPY, max_tokens=32, temperature=0, prediction=prediction
        )
        replies.append(reply)
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content
    plain, spec = (r.usage.completion_tokens_details for r in replies)
    assert plain.accepted_prediction_tokens == plain.rejected_prediction_tokens == 0
    assert spec.accepted_prediction_tokens > 0 and spec.rejected_prediction_tokens >= 0
    client = openai.OpenAI(base_url=f"{servers[1].url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=COPY,
        max_tokens=32,
        temperature=0,
        prediction={"type": "content", "content": CODE},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == replies[1].choices[0].message.content
    assert (
        chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens
        == spec.accepted_prediction_tokens
    )
    for bad, says in [
        ({"type": "text", "content": CODE}, "'prediction.type' must be 'content'"),
        (
            {"type": "content", "content": 5},
            "'prediction.content' must be a string or an array of text parts",
        ),
        ({"type": "content", "content": [{"type": "image_url"}]}, "'prediction.content' parts must be"),
        ("some text", "'prediction' must be an object"),
    ]:
        r = httpx.post(
            f"{servers[1].url}/v1/chat/completions",
            json={"model": "smollm2", "messages": COPY, "max_tokens": 4, "prediction": bad},
        )
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
