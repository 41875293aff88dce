"""`POST /v1/embeddings` through the official OpenAI SDK, on a tiny bare Qwen3 decoder (an embedding model,
as Qwen3-Embedding is) over the embedded tokenizer: each vector is transformers' last-token hidden state,
normalized; base64 and float agree; `dimensions` truncates; a batch larger than --max-concurrency is
answered whole and in order; the model makes no text; bad input is one line. llama-server's `/embedding`
and `/embeddings`: its reply shape and `embd_normalize` for a `content` body, OpenAI's for an `input` one."""

from __future__ import annotations

import json
import math

import httpx2 as httpx
import openai
import pytest
import torch
from conftest import save_tiny, tiny_hf_model
from server import RunningServer

from engine.async_llm import AsyncLLM
from engine.pooling import normalized

TEXTS = ["def add(a, b):\n    return a + b", "the capital of France", "x", "Paris is a city in France."]


@pytest.fixture(scope="module")
def served(tmp_path_factory, default_tokenizer):
    path = tmp_path_factory.mktemp("embedder")
    model = tiny_hf_model(
        "qwen3", tied=False, vocab_size=default_tokenizer.vocab_size, max_position_embeddings=256
    )
    save_tiny(model.model, path)  # bare decoder: no head
    default_tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": default_tokenizer.eos_token}))
    with RunningServer(AsyncLLM(path, max_concurrency=2)) as server:
        yield server, model


@pytest.fixture
def oai(served):
    return openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="x", max_retries=0)


def _reference(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        return normalized(model.model(torch.tensor([ids])).last_hidden_state[0, -1].tolist())


def _close(a, b, tol=1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < tol


def test_embeddings_are_the_models_pooled_hidden_states(served, oai):
    server, model = served
    r = oai.embeddings.create(model="m", input=TEXTS)  # the SDK asks for base64 and decodes it
    ids = [server.engine.tokenizer.encode(t) for t in TEXTS]
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    for item, prompt in zip(r.data, ids):
        assert _close(item.embedding, _reference(model, prompt))
        assert math.isclose(sum(v * v for v in item.embedding), 1.0, rel_tol=1e-5)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    floats = oai.embeddings.create(model="m", input=TEXTS[0], encoding_format="float")
    assert _close(floats.data[0].embedding, r.data[0].embedding, 1e-6)
    # token ids, one array or several
    by_ids = oai.embeddings.create(model="m", input=ids[1])
    assert _close(by_ids.data[0].embedding, r.data[1].embedding, 1e-6)
    several = oai.embeddings.create(model="m", input=ids[:2])
    assert _close(several.data[1].embedding, r.data[1].embedding, 1e-6)


def test_dimensions_keep_the_first_values_normalized_again(served, oai):
    full = oai.embeddings.create(model="m", input=TEXTS[3]).data[0].embedding
    short = oai.embeddings.create(model="m", input=TEXTS[3], dimensions=8).data[0].embedding
    assert len(short) == 8 and _close(short, normalized(full[:8]), 1e-5)
    raw = httpx.post(
        f"{served[0].url}/v1/embeddings",
        json={"input": TEXTS[3], "normalize": False, "encoding_format": "float"},
        timeout=60,
    ).json()["data"][0]["embedding"]
    assert _close(normalized(raw), full, 1e-5) and not math.isclose(
        sum(v * v for v in raw), 1.0, rel_tol=1e-3
    )


def test_a_batch_beyond_the_concurrency_is_answered_whole_and_in_order(served, oai):
    server, model = served
    texts = [f"item number {i} of the batch" for i in range(9)]  # --max-concurrency 2
    r = oai.embeddings.create(model="m", input=texts)
    assert len(r.data) == 9
    for text, item in zip(texts, r.data):
        assert _close(item.embedding, _reference(model, server.engine.tokenizer.encode(text)))
    stats = server.engine.stats()
    assert stats["num_running"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_an_embedding_model_makes_no_text(oai):
    with pytest.raises(openai.BadRequestError, match="is an embedding model .* serve a chat model"):
        oai.completions.create(model="m", prompt="hi", max_tokens=4)
    # chat too, before the (absent) chat template is looked for
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'input' must be a string"),
        ({"input": 5}, "'input' must be a string"),
        ({"input": []}, "'input' must be a string"),
        ({"input": ["ok", ""]}, "input 1 is empty"),
        ({"input": [[1, 2], []]}, "input 1 is empty"),
        ({"input": [[1, -2]]}, "'input' must be a string"),
        ({"input": ["a"] * 2049}, "2049 inputs in one request; at most 2048"),
        ({"input": "a", "encoding_format": "int8"}, "'encoding_format' must be float or base64"),
        ({"input": "a", "dimensions": 0}, "'dimensions' must be at least 1"),
        ({"input": "a", "dimensions": 65}, "dimensions must be between 1 and 64"),
        ({"input": "word " * 300}, "This model's maximum context length is 256 tokens"),
    ],
)
def test_bad_requests_get_one_line(served, body, message):
    r = httpx.post(f"{served[0].url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and "\n" not in r.json()["error"]["message"]


def test_truncate_prompt_tokens_embeds_the_inputs_end(served):
    server, model = served
    text = "word " * 300  # beyond the 256-token context
    r = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": text, "truncate_prompt_tokens": -1, "encoding_format": "float"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    kept = server.engine.tokenizer.encode(text)[-255:]
    assert r.json()["usage"]["prompt_tokens"] == 255
    assert _close(r.json()["data"][0]["embedding"], _reference(model, kept))


def test_an_embedding_model_does_not_rerank(served):
    r = httpx.post(f"{served[0].url}/v1/rerank", json={"query": "q", "documents": ["d"]}, timeout=60)
    assert r.status_code == 400 and "this model is not a reranker" in r.json()["error"]["message"]


def _llama(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_llama_servers_embedding_routes_answer_in_its_shape(served, path):
    server, model = served
    ids = [server.engine.tokenizer.encode(t) for t in TEXTS]
    r = _llama(server, path, {"content": TEXTS})
    assert r.status_code == 200, r.text
    assert [item["index"] for item in r.json()] == list(range(len(TEXTS)))
    for item, prompt in zip(r.json(), ids):
        assert set(item) == {"index", "embedding"} and len(item["embedding"]) == 1  # one pooled vector
        assert _close(item["embedding"][0], _reference(model, prompt))
    one = _llama(server, path, {"content": TEXTS[1]}).json()
    assert len(one) == 1 and _close(one[0]["embedding"][0], r.json()[1]["embedding"][0], 1e-6)
    by_ids = _llama(server, path, {"content": ids[1]}).json()
    assert _close(by_ids[0]["embedding"][0], r.json()[1]["embedding"][0], 1e-6)
    # an OpenAI body (`input`) gets OpenAI's reply, as from /v1/embeddings
    oai = _llama(server, path, {"input": TEXTS[1], "encoding_format": "float"}).json()
    assert oai["object"] == "list" and _close(oai["data"][0]["embedding"], one[0]["embedding"][0], 1e-6)


def test_embd_normalize_takes_llama_servers_norms(served):
    server, _ = served
    text = TEXTS[3]

    def vector(norm: int | None) -> list[float]:
        body = {"content": text} if norm is None else {"content": text, "embd_normalize": norm}
        r = _llama(server, "/embedding", body)
        assert r.status_code == 200, r.text
        return r.json()[0]["embedding"][0]

    raw = vector(-1)
    unnormalized = _llama(server, "/v1/embeddings", {"input": text, "normalize": False})
    assert _close(raw, unnormalized.json()["data"][0]["embedding"], 1e-6)
    assert _close(vector(None), vector(2), 1e-7) and _close(vector(2), normalized(raw), 1e-6)
    int16 = vector(0)
    assert math.isclose(max(abs(v) for v in int16), 32760.0, rel_tol=1e-6)
    assert _close([v / 32760.0 for v in int16], [v / max(abs(x) for x in raw) for v in raw], 1e-6)
    assert math.isclose(sum(abs(v) for v in vector(1)), 1.0, rel_tol=1e-6)
    assert math.isclose(sum(abs(v) ** 3 for v in vector(3)), 1.0, rel_tol=1e-6)
    # a p so large that |v|^p would overflow: the p-norm tends to the largest magnitude
    assert math.isclose(max(abs(v) for v in vector(10**6)), 1.0, rel_tol=1e-4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "'content' must be a string"),
        ({"content": 5}, "'content' must be a string"),
        ({"content": ["ok", ""]}, "content 1 is empty"),
        ({"content": "a", "embd_normalize": -2}, "'embd_normalize' must be -1 (none), 0 (int16 range)"),
        ({"content": "a", "embd_normalize": "2"}, "'embd_normalize'"),
        ({"content": "word " * 300}, "This model's maximum context length is 256 tokens"),
    ],
)
def test_llama_servers_routes_refuse_bad_bodies_in_one_line(served, body, message):
    r = _llama(served[0], "/embedding", body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and "\n" not in r.json()["error"]["message"]
