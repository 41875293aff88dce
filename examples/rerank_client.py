"""Reranking against `ninfer serve RERANKER` (a Qwen3-Reranker: its HF directory, a classifier conversion or a
rank GGUF): the Cohere / Jina shape, TEI's, and vLLM's /v1/score. Another model answers each in one line
saying how to serve a reranker."""

import json
import os
import urllib.error
import urllib.request

URL = os.environ.get("NINFER_URL", "http://127.0.0.1:8000")  # where `ninfer serve` listens
QUERY = "How do I read a file line by line in Python?"
DOCUMENTS = [
    "with open(path) as f:\n    for line in f:\n        print(line.rstrip())",
    "Lists are mutable sequences, typically used to store collections of homogeneous items.",
    "pathlib.Path.read_text() returns the decoded contents of the file as a single string.",
]


def post(path: str, body: dict):
    request = urllib.request.Request(
        f"{URL}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        raise SystemExit(json.load(e)["error"]["message"]) from None


# Cohere / Jina: the documents sorted by relevance, the top two, with a task instruction of our own
reply = post(
    "/v1/rerank",
    {
        "query": QUERY,
        "documents": DOCUMENTS,
        "top_n": 2,
        "instruction": "Given a programming question, find the snippet that answers it",
    },
)
for result in reply["results"]:
    print(f"{result['relevance_score']:.3f}  #{result['index']}  {result['document']['text'][:60]!r}")

# TEI's shape: `texts` in, a bare array out (raw_scores: the log-odds instead of a probability)
print(post("/rerank", {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}))

# vLLM's /v1/score: one query against each text, in order
print([item["score"] for item in post("/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS})["data"]])
