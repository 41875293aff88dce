"""Ollama's discovery routes (engine/api/ollama.py), as GitHub Copilot Chat's Ollama provider reads them:
the version gate, the model list, each model's capabilities and context length; errors in Ollama's shape."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from scripted_engine import QWEN_STYLE_TEMPLATE
from server import RunningServer

from engine.api.ollama import OLLAMA_API_VERSION
from engine.async_llm import AsyncLLM
from engine.models.loader import default_model_path

KEY = "sekrit"


@pytest.fixture(scope="module")
def server():
    with RunningServer(AsyncLLM(max_context=2048), model_id="smollm2", api_key=KEY) as s:
        yield s


def get(server, path, **kwargs):
    return httpx.get(server.url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=30, **kwargs)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def test_the_root_answers_as_ollamas_does(server):
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and r.text.startswith("ninfer is running (smollm2)")
    assert httpx.head(server.url + "/").status_code == 200


def test_the_version_gate_passes_copilots_minimum():
    parts = [int(p) for p in OLLAMA_API_VERSION.split(".")]
    assert parts >= [0, 6, 4]


def test_tags_list_the_served_model_with_its_files_details(server):
    assert httpx.get(server.url + "/api/version").json() == {"version": OLLAMA_API_VERSION}  # no key needed
    (entry,) = get(server, "/api/tags").json()["models"]
    assert entry["name"] == entry["model"] == "smollm2"
    assert entry["size"] == default_model_path().stat().st_size and entry["modified_at"].endswith("Z")
    details = entry["details"]
    assert details["format"] == "gguf" and details["quantization_level"] == "Q4_1"
    assert details["family"] == "llama" and details["parameter_size"].endswith("M")
    (loaded,) = get(server, "/api/ps").json()["models"]
    assert loaded["context_length"] == 2048 and loaded["size_vram"] == 0  # on the CPU


def test_show_gives_capabilities_and_the_context_length(server):
    r = post(server, "/api/show", {"model": "smollm2"})
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["capabilities"] == ["completion"]  # SmolLM2's template writes no tools, no thinking
    arch = info["model_info"]["general.architecture"]
    assert info["model_info"][f"{arch}.context_length"] == 2048
    assert info["model_info"]["general.basename"] == "smollm2" and "im_start" in info["template"]
    assert post(server, "/api/show", {"name": "smollm2"}).status_code == 200  # the older field name
    assert post(server, "/api/show", {"model": "smollm2:latest"}).status_code == 200  # the default tag


def test_unknown_models_and_missing_keys_are_refused_in_ollamas_shape(server):
    r = post(server, "/api/show", {"model": "llama3:8b"})
    assert r.status_code == 404 and r.json() == {
        "error": "model 'llama3:8b' not found; this server serves 'smollm2'"
    }
    assert post(server, "/api/show", {}).json()["error"].startswith("'model' is required")
    r = httpx.get(server.url + "/api/tags")
    assert r.status_code == 401 and set(r.json()) == {"error"}


def test_pulling_the_served_model_succeeds_and_any_other_is_refused(server):
    """`ollama pull` / `ollama run` pull first: the served name (`:latest` or not) is up to date; another is
    refused in one sentence that says what to do."""
    with httpx.stream(
        "POST", server.url + "/api/pull", json={"model": "smollm2:latest"}, headers={"x-api-key": KEY}
    ) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        assert [line for line in r.iter_lines() if line] == ['{"status": "success"}']
    assert post(server, "/api/pull", {"name": "smollm2", "stream": False}).json() == {"status": "success"}
    r = post(server, "/api/pull", {"model": "qwen3:8b"})
    assert r.status_code == 404 and set(r.json()) == {"error"}
    assert (
        "'qwen3:8b' is not served here" in r.json()["error"] and "restart `ninfer serve`" in r.json()["error"]
    )
    assert post(server, "/api/pull", {}).status_code == 400
    assert httpx.post(server.url + "/api/pull", json={"model": "smollm2"}).status_code == 401


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/push"),
        ("POST", "/api/create"),
        ("POST", "/api/copy"),
        ("DELETE", "/api/delete"),
        ("POST", "/api/blobs/sha256:0123abcd"),
        ("HEAD", "/api/blobs/sha256:0123abcd"),
    ],
)
def test_changing_the_models_held_is_refused_in_one_sentence(server, method, path):
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.request(method, server.url + path, json={"model": "smollm2"}, headers=headers, timeout=30)
    assert r.status_code == 501
    if method != "HEAD":
        (error,) = r.json().values()
        assert "is not served" in error and "'smollm2'" in error and "\n" not in error
    assert httpx.request(method, server.url + path, timeout=30).status_code == 401  # behind the key too


def test_a_template_with_tools_and_thinking_says_so(tmp_path):
    template = tmp_path / "qwen.jinja"
    template.write_text(QWEN_STYLE_TEMPLATE)
    with RunningServer(AsyncLLM(max_context=1024, chat_template=str(template)), model_id="q") as s:
        info = httpx.post(s.url + "/api/show", json={"model": "q"}, timeout=30).json()
    assert info["capabilities"] == ["completion", "tools", "thinking"]
