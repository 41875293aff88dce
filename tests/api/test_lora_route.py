"""`serve --lora NAME=PATH`: a request whose model names an adapter runs with it (OpenAI, Anthropic, llama.cpp
routes), replies name it, /v1/models lists it with its parent; other names run the base model."""

from __future__ import annotations

import re

import anthropic
import httpx2 as httpx
import openai
import pytest
from conftest import run_serve, write_lora_adapter
from server import RunningServer

from engine.async_llm import AsyncLLM
from engine.models.loader import open_source

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def write_adapter(path, config, scale: float):
    """An adapter for the embedded model's q, v and down projections (B times `scale`: 0 is a no-op)."""
    hidden, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.v_proj": (hidden, kv),
        "mlp.down_proj": (config.intermediate_size, hidden),
    }
    return write_lora_adapter(path, shapes, config.num_hidden_layers, scale)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    config = open_source(None).config
    adapters = {
        "loud": str(write_adapter(d / "loud", config, 0.5)),
        "zero": str(write_adapter(d / "zero", config, 0)),
    }
    engine = AsyncLLM(lora_modules=adapters, max_context=2048)
    with RunningServer(engine, model_id="smollm2") as s:
        yield s


def chat(oai, model):
    r = oai.chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=0)
    return r.model, r.choices[0].message.content


def test_the_model_field_picks_the_adapter(server):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    base_model, base = chat(oai, "smollm2")
    assert base_model == "smollm2" and "Paris" in base
    loud_model, loud = chat(oai, "loud")
    assert loud_model == "loud" and loud != base
    assert chat(oai, "loud") == (loud_model, loud)  # (greedy: the same again)
    assert chat(oai, "zero") == ("zero", base)  # an adapter of zeros leaves the model as it is
    assert chat(oai, "claude-sonnet-4") == ("smollm2", base)  # any other name: the base model
    # streamed chunks name the adapter too
    chunks = list(
        oai.chat.completions.create(model="loud", messages=ASK, max_tokens=12, temperature=0, stream=True)
    )
    assert {c.model for c in chunks} == {"loud"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == loud
    # the completions route and llama.cpp's /completion
    text = oai.completions.create(
        model="loud", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    plain = oai.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert text.model == "loud" and text.choices[0].text != plain.choices[0].text
    body = {"model": "loud", "prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
    llama = httpx.post(f"{server.url}/completion", json=body, timeout=60).json()
    assert llama["model"] == "loud" and llama["content"] == text.choices[0].text


def test_anthropic_messages_pick_the_adapter(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    replies = {
        model: client.messages.create(model=model, max_tokens=12, messages=ASK, extra_body={"temperature": 0})
        for model in ("smollm2", "loud")
    }
    assert replies["loud"].model == "loud"
    assert replies["loud"].content[0].text != replies["smollm2"].content[0].text


def test_models_lists_the_adapters(server):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    cards = {m.id: m for m in oai.models.list().data}
    assert list(cards) == ["smollm2", "loud", "zero"]
    loud = oai.models.retrieve("loud")
    assert loud.parent == "smollm2" and loud.root.endswith("loud")
    with pytest.raises(openai.NotFoundError, match="this server serves 'smollm2', 'loud', 'zero'"):
        oai.models.retrieve("quiet")


def test_llama_server_lora_adapters_and_per_request_scales(server):
    """llama-server's way: GET /lora-adapters lists ids, paths and default scales; a request's `lora` list
    runs those adapters at those scales (the others at 0); POST /lora-adapters sets what a request that
    picks none runs with."""
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    base, loud = chat(oai, "smollm2")[1], chat(oai, "loud")[1]
    listing = httpx.get(f"{server.url}/lora-adapters", timeout=30).json()
    assert [(a["id"], a["path"].rsplit("/", 1)[-1], a["scale"]) for a in listing] == [
        (0, "loud", 0.0),
        (1, "zero", 0.0),
    ]

    def ask(body):
        body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, **body}
        r = httpx.post(f"{server.url}/completion", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["content"]

    def chat_with(lora):
        r = oai.chat.completions.create(
            model="smollm2", messages=ASK, max_tokens=12, temperature=0, extra_body={"lora": lora}
        )
        return r.model, r.choices[0].message.content

    plain, with_loud = ask({}), ask({"model": "loud"})
    assert plain != with_loud
    assert ask({"lora": [{"id": 0, "scale": 1.0}]}) == with_loud
    assert ask({"lora": [{"id": 0, "scale": 0}, {"id": 1, "scale": 1}]}) == plain
    half = ask({"lora": [{"id": 0, "scale": 0.5}]})
    assert half not in (plain, with_loud)  # a scale between: another model
    assert chat_with([{"id": 0, "scale": 1}]) == ("smollm2", loud)
    assert chat_with([]) == ("smollm2", base)
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    counted = {
        ln.split('"')[1]: float(ln.split()[-1])
        for ln in metrics.splitlines()
        if ln.startswith("ninfer_lora_requests_total{")
    }
    assert counted["loud"] >= 4 and counted["zero"] >= 1  # each adapter of a mix counts

    r = httpx.post(f"{server.url}/lora-adapters", json=[{"id": 0, "scale": 0.5}], timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}
    try:
        assert [a["scale"] for a in httpx.get(f"{server.url}/lora-adapters", timeout=30).json()] == [0.5, 0.0]
        assert ask({}) == half  # the default now
        assert ask({"lora": []}) == plain  # an empty list: no adapter
        assert ask({"model": "loud"}) == with_loud  # the model's name still picks its adapter alone
    finally:
        httpx.post(f"{server.url}/lora-adapters", json=[], timeout=30)
    assert ask({}) == plain

    def refused(route, body):
        r = httpx.post(f"{server.url}{route}", json=body, timeout=30)
        assert r.status_code == 400, r.text
        return r.json()["error"]["message"]

    assert refused("/completion", {"prompt": "x", "lora": [{"id": 7, "scale": 1}]}) == (
        "'lora' names LoRA adapter id 7, which is not loaded; the ids are: 0 (loud), 1 (zero)"
    )
    assert "takes {" in refused("/completion", {"prompt": "x", "lora": [{"id": "0", "scale": 1}]})
    assert "takes {" in refused("/completion", {"prompt": "x", "lora": [{"id": 0}]})
    assert "is a list of" in refused("/v1/completions", {"prompt": "x", "lora": {"id": 0}})
    assert "use one" in refused("/v1/completions", {"model": "loud", "prompt": "x", "lora": []})
    assert "id 3" in refused("/lora-adapters", [{"id": 3, "scale": 1}])
    assert [a["scale"] for a in httpx.get(f"{server.url}/lora-adapters", timeout=30).json()] == [0.0, 0.0]


def test_serve_refuses_a_default_adapter_it_does_not_load():
    proc = run_serve("--lora-default", "sql=0.5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --lora-default sql: no such adapter; the adapters are: none: add --lora NAME=PATH"
    )


def test_serve_refuses_an_adapter_folder_that_is_not_there(tmp_path):
    proc = run_serve("--lora", f"sql={tmp_path / 'none'}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: LoRA adapter 'sql': {tmp_path / 'none'} is not a folder; give the folder peft's "
        "save_pretrained wrote (adapter_config.json and adapter_model.safetensors), or a LoRA adapter .gguf"
    )


def test_adapters_load_and_unload_while_serving(server, tmp_path):
    """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (serve --enable-lora); a name loaded again
    holds the new weights, not the old load's cached pages."""
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)

    def post(route, body):
        return httpx.post(f"{server.url}/v1/{route}", json=body, timeout=60)

    config = server.engine.llm.model_config
    late = write_adapter(tmp_path / "late", config, 0.5)
    r = post("load_lora_adapter", {"lora_name": "late", "lora_path": str(late)})
    assert r.status_code == 404 and "start serve with --enable-lora" in r.json()["error"]["message"]
    server.state.lora_updates = True
    try:
        base = chat(oai, "smollm2")[1]
        r = post("load_lora_adapter", {"lora_name": "late", "lora_path": str(late)})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' added successfully."
        assert [m.id for m in oai.models.list().data] == ["smollm2", "loud", "zero", "late"]
        model, late_reply = chat(oai, "late")
        assert model == "late" and late_reply != base
        r = post("load_lora_adapter", {"lora_name": "late", "lora_path": str(late)})
        assert r.status_code == 400 and "is loaded already" in r.json()["error"]["message"]
        r = post("load_lora_adapter", {"lora_name": "other", "lora_path": str(tmp_path / "none")})
        assert r.status_code == 400 and "is not a folder" in r.json()["error"]["message"]
        r = post("unload_lora_adapter", {"lora_name": "late"})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' removed successfully."
        assert chat(oai, "late") == ("smollm2", base)  # no longer an adapter's name: the base model
        r = post("unload_lora_adapter", {"lora_name": "late"})
        assert r.status_code == 404 and "no LoRA adapter 'late' is loaded" in r.json()["error"]["message"]
        # the same name again, now an adapter of zeros: the base model's reply, not the cached first load's
        r = post(
            "load_lora_adapter",
            {"lora_name": "late", "lora_path": str(write_adapter(tmp_path / "z", config, 0))},
        )
        assert r.status_code == 200
        assert chat(oai, "late") == ("late", base)
        assert post("unload_lora_adapter", {"lora_name": "late"}).status_code == 200
    finally:
        server.state.lora_updates = False


def test_metrics_name_the_adapters_running(server):
    """vLLM's vllm:lora_requests_info, as a router with LoRA affinity reads it: the adapters of the running
    requests while one streams, none once it is done."""

    def lora_info() -> dict:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        (line,) = [ln for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")]
        return dict(re.findall(r'(\w+)="([^"]*)"', line))

    body = {
        "model": "loud",
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # (held: a closed iterator would close the stream, and the request with it)
        assert next(lines).startswith("data: ")  # its first token: running now
        info = lora_info()
    assert info == {"max_lora": "2", "waiting_lora_adapters": "", "running_lora_adapters": "loud"}
    server.wait_idle()
    assert lora_info()["running_lora_adapters"] == ""
