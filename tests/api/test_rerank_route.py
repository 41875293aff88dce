"""Reranking over HTTP on a tiny Qwen3-Reranker (a causal LM recognised by its model card) over the embedded
tokenizer: Cohere / Jina's `/v1/rerank` (and its aliases) sorts the documents by the model's P(yes), with
`top_n`, `return_documents`, object documents, an `instruction` and `max_tokens_per_doc`; TEI's shape
(`texts`, `raw_scores`, `return_text`, `truncate`); vLLM's `/v1/score`; bad input is one line; the API key
guards the routes outside /v1/."""

from __future__ import annotations

import math

import httpx2 as httpx
import pytest
import torch
from conftest import save_tiny, tiny_hf_model
from server import RunningServer

from engine.async_llm import AsyncLLM

QUERY = "where is the capital of France"
DOCS = ["Paris is the capital of France.", "def add(a, b): return a + b", "The Loire flows west.", "Paris"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, default_tokenizer):
    path = tmp_path_factory.mktemp("reranker")
    model = tiny_hf_model(
        "qwen3", tied=True, seed=2, vocab_size=default_tokenizer.vocab_size, max_position_embeddings=256
    )
    save_tiny(model, path)
    default_tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "README.md").write_text("# Qwen3-Reranker-4B\n")
    with RunningServer(AsyncLLM(path, max_concurrency=2), api_key="k") as server:
        yield server, model


def _post(served, path: str, body: dict, key: str | None = "k") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{served[0].url}{path}", json=body, headers=headers, timeout=120)


def _probability(served, query: str, document: str, instruction: str | None = None) -> float:
    """transformers' P(yes) over yes / no after the pair's prompt (its text is engine/rerank.py's, checked
    against the model card's recipe in tests/engine/test_rerank.py)."""
    server, model = served
    ids = server.engine.llm.rerank_ids(query, document, instruction)
    tok = server.engine.tokenizer
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    return torch.sigmoid(logits[yes] - logits[no]).item()


@pytest.fixture(scope="module")
def expected(served):
    return [_probability(served, QUERY, d) for d in DOCS]


def test_rerank_sorts_the_documents_by_relevance(served, expected):
    r = _post(served, "/v1/rerank", {"model": "m", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    indices = [item["index"] for item in body["results"]]
    assert sorted(indices) == list(range(len(DOCS)))
    assert indices == sorted(range(len(DOCS)), key=lambda i: -expected[i])  # most relevant first
    for item in body["results"]:
        assert math.isclose(item["relevance_score"], expected[item["index"]], abs_tol=1e-5)
        assert item["document"] == {"text": DOCS[item["index"]]}
    server = served[0]
    tokens = sum(len(server.engine.llm.rerank_ids(QUERY, d)) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens} and body["model"] == "smollm2"
    stats = server.engine.stats()
    assert stats["num_running"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank", "/v1/reranking", "/reranking"])
def test_top_n_objects_and_no_documents_on_every_alias(served, expected, path):
    documents = [{"text": d} for d in DOCS]
    r = _post(served, path, {"query": QUERY, "documents": documents, "top_n": 2, "return_documents": False})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    best = sorted(range(len(DOCS)), key=lambda i: -expected[i])[:2]
    assert [item["index"] for item in results] == best and all("document" not in item for item in results)


def test_an_instruction_changes_the_task(served):
    task = "Given a code question, find the snippet that answers it"
    r = _post(served, "/v1/rerank", {"query": QUERY, "documents": DOCS[:2], "instruction": task})
    assert r.status_code == 200, r.text
    for item in r.json()["results"]:
        want = _probability(served, QUERY, DOCS[item["index"]], task)
        assert math.isclose(item["relevance_score"], want, abs_tol=1e-5)
        assert not math.isclose(want, _probability(served, QUERY, DOCS[item["index"]]), abs_tol=1e-6)


def test_tei_shape_raw_scores_text_and_truncate(served, expected):
    r = _post(served, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True, "raw_scores": True})
    assert r.status_code == 200, r.text
    items = r.json()
    assert isinstance(items, list) and [i["index"] for i in items] == sorted(
        range(4), key=lambda i: -expected[i]
    )
    for item in items:  # raw: the log-odds
        p = expected[item["index"]]
        assert math.isclose(item["score"], math.log(p / (1 - p)), abs_tol=1e-4)
        assert item["text"] == DOCS[item["index"]]
    long = "word " * 400  # beyond the 256-token context
    refused = _post(served, "/rerank", {"query": QUERY, "texts": [long]})
    assert refused.status_code == 400 and "document 0 with the query is" in refused.json()["error"]["message"]
    cut = _post(served, "/rerank", {"query": QUERY, "texts": [long], "truncate": True})
    assert cut.status_code == 200 and 0 < cut.json()[0]["score"] < 1


def test_max_tokens_per_doc_cuts_each_document(served):
    long = "The river Seine runs through Paris. " * 20
    r = _post(served, "/v1/rerank", {"query": QUERY, "documents": [long], "max_tokens_per_doc": 5})
    assert r.status_code == 200, r.text
    tok = served[0].engine.tokenizer
    head = tok.decode(tok.encode(long, add_special_tokens=False)[:5])
    assert math.isclose(
        r.json()["results"][0]["relevance_score"], _probability(served, QUERY, head), abs_tol=1e-5
    )
    assert r.json()["usage"]["prompt_tokens"] == len(served[0].engine.llm.rerank_ids(QUERY, head))


def test_score_one_against_many_and_pair_by_pair(served, expected):
    r = _post(served, "/v1/score", {"model": "m", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2, 3] and all(d["object"] == "score" for d in data)
    assert all(math.isclose(d["score"], want, abs_tol=1e-5) for d, want in zip(data, expected))
    pairs = _post(served, "/score", {"text_1": [QUERY, "a river"], "text_2": DOCS[:2]}).json()["data"]
    assert math.isclose(pairs[1]["score"], _probability(served, "a river", DOCS[1]), abs_tol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/rerank", {"documents": DOCS}, "'query' must be a non-empty string"),
        ("/v1/rerank", {"query": QUERY}, "'documents' must be a non-empty array"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, "'documents' must be a non-empty array"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a", 3]}, "documents[1] must be a string or an object"),
        ("/v1/rerank", {"query": QUERY, "documents": [{"title": "a"}]}, "documents[0] must be a string"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0}, "'top_n' must be 1 or more"),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": ["a"] * 1001},
            "1001 documents in one request; at most 1000",
        ),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 0},
            "'max_tokens_per_doc' must",
        ),
        (
            "/v1/rerank",
            {"query": "q " * 300, "documents": ["a"], "max_tokens_per_doc": 4},
            "beyond the context",
        ),
        ("/rerank", {"query": "q " * 300, "texts": ["a"], "truncate": True}, "no document fits beside them"),
        ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "'text_1' holds 2 texts and 'text_2' 4"),
        ("/v1/score", {"text_1": QUERY, "text_2": []}, "'text_2' must be a string or a non-empty array"),
    ],
)
def test_bad_requests_get_one_line(served, path, body, message):
    r = _post(served, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]["message"]
    assert message in error and "\n" not in error


@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank", "/reranking", "/score", "/v1/rerank"])
def test_the_api_key_guards_every_route(served, path):
    assert _post(served, path, {"query": QUERY, "documents": DOCS}, key=None).status_code == 401


def test_the_pairs_of_a_query_compute_its_part_once(served):
    """The later pairs wait for the first to run its prompt, then start from its pages: every pair but the
    first takes the prompt up to its document from the prefix cache (--max-concurrency 2 would otherwise
    run the first two side by side)."""
    server = served[0]
    query = " ".join(f"term{i}" for i in range(40))  # a query no earlier test sent
    prompts = [server.engine.llm.rerank_ids(query, d) for d in DOCS]
    shared = next(i for i, ids in enumerate(zip(*prompts)) if len(set(ids)) > 1)
    before = server.state.metrics.cached_tokens._value.get()
    assert _post(served, "/v1/rerank", {"query": query, "documents": DOCS}).status_code == 200
    block = server.engine.llm.engine_config.block_size
    assert server.state.metrics.cached_tokens._value.get() - before >= (len(DOCS) - 1) * (
        shared // block * block
    )
