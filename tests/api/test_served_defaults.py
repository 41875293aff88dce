"""`serve --generation-config FILE --chat-template FILE` on the embedded model: requests that leave the
sampling fields out take the file's, and prompts are rendered with the template given."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.async_llm import AsyncLLM

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\nAnswer: "
)
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("defaults")
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 5}))
    (d / "template.jinja").write_text(TEMPLATE)
    engine = AsyncLLM(
        generation_config=str(d / "generation_config.json"), chat_template=str(d / "template.jinja")
    )
    with RunningServer(engine) as s:
        yield s


def test_left_out_fields_take_the_served_defaults(server):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    assert server.engine.llm.sampling_defaults == {"temperature": 0.0, "top_k": 5}
    # temperature 0 from the file: two requests without one answer alike, as an explicit greedy one does
    runs = [
        oai.chat.completions.create(model="m", messages=ASK, max_tokens=12).choices[0].message.content
        for _ in range(2)
    ]
    greedy = (
        oai.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0)
        .choices[0]
        .message.content
    )
    assert runs[0] == runs[1] == greedy
    # a field the request sets is its own
    sampled = {
        oai.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=1.5, seed=s)
        .choices[0]
        .message.content
        for s in range(4)
    }
    assert len(sampled) > 1


def test_prompts_use_the_template_given(server):
    r = httpx.post(f"{server.url}/tokenize", json={"messages": ASK}, timeout=30).json()
    text = server.engine.tokenizer.decode(r["tokens"], skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\nAnswer: ") and "What is the capital of France?" in text


def test_props_reports_the_served_defaults_context_and_template(server):
    """llama-server's GET /props: the defaults a request gets (the file's temperature and top_k, ninfer's
    own for the rest), the context, the slots, the template in use, no vision on a text model."""
    r = httpx.get(f"{server.url}/props", timeout=30)
    assert r.status_code == 200, r.text
    props = r.json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == server.engine.llm.max_context
    assert settings["params"]["temperature"] == 0.0 and settings["params"]["top_k"] == 5
    assert settings["params"]["top_p"] == 1.0 and settings["params"]["n_predict"] == -1
    assert props["total_slots"] == server.engine.llm.engine_config.max_concurrency
    assert props["chat_template"] == TEMPLATE and props["eos_token"] == server.engine.tokenizer.eos_token
    assert props["modalities"] == {"vision": False, "audio": False}
    assert props["build_info"].startswith("ninfer")
    assert httpx.post(f"{server.url}/props", json={}, timeout=30).status_code == 405


# Qwen3's way: thinking on unless enable_thinking is false
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}"
    "{{ greeting | default('') }}"
)


@pytest.fixture(scope="module")
def thinking_off(tmp_path_factory):
    """serve --chat-template-kwargs '{"enable_thinking": false, "greeting": "Hi. "}' over a template that
    thinks by default."""
    d = tmp_path_factory.mktemp("kwargs")
    (d / "template.jinja").write_text(THINKING)
    engine = AsyncLLM(
        chat_template=str(d / "template.jinja"),
        chat_template_kwargs='{"enable_thinking": false, "greeting": "Hi. "}',
    )
    with RunningServer(engine) as s:
        yield s


def test_served_template_kwargs_apply_unless_a_request_says_otherwise(thinking_off):
    url = thinking_off.url

    def prompt(**body) -> str:
        r = httpx.post(f"{url}/apply-template", json={"messages": ASK, **body}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    assert prompt().endswith("<|im_start|>assistant\nHi. ")  # the served defaults
    assert prompt(chat_template_kwargs={"enable_thinking": True}).endswith("assistant\n<think>\nHi. ")
    assert prompt(reasoning_effort="high").endswith("assistant\n<think>\nHi. ")  # as chat completions
    assert prompt(chat_template_kwargs={"greeting": ""}).endswith("assistant\n")  # key by key

    def counted(**body) -> int:
        r = httpx.post(
            f"{url}/v1/messages/count_tokens", json={"model": "m", "messages": ASK, **body}, timeout=30
        )
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    # Anthropic: no thinking field is the served default (off here), as "disabled" is; "enabled" opens <think>
    assert counted() == counted(thinking={"type": "disabled"}) < counted(thinking={"type": "enabled"})
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    reply = oai.chat.completions.create(model="m", messages=ASK, max_tokens=4, temperature=0)
    assert reply.usage.prompt_tokens == len(thinking_off.engine.tokenizer.encode(prompt(), False))
