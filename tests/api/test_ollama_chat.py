"""Ollama's own protocol (engine/api/ollama_chat.py): /api/chat and /api/generate read into the OpenAI
routes' fields and answered as Ollama answers (NDJSON lines by default, one object with stream false),
tools, thinking, options, formats; /api/embed with a real engine; errors in Ollama's shape."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.async_llm import AsyncLLM

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
)
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=30)


def lines(server, path, body):
    with httpx.stream("POST", server.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r.iter_lines() if line]


def test_chat_answers_in_one_object_or_in_lines():
    engine = ScriptedEngine(["It is sunny in Paris.", "It is sunny in Paris."])
    with RunningServer(engine) as server:
        reply = post(server, "/api/chat", {"model": "m", "messages": ASK, "stream": False}).json()
        assert reply["message"] == {"role": "assistant", "content": "It is sunny in Paris."}
        assert reply["done"] is True and reply["done_reason"] == "stop" and reply["model"] == "m"
        assert reply["eval_count"] > 0 and reply["prompt_eval_count"] > 0
        assert all(
            isinstance(reply[k], int) for k in ("total_duration", "prompt_eval_duration", "eval_duration")
        )
        got = lines(server, "/api/chat", {"model": "m", "messages": ASK})  # streaming is the default
        assert all(not g["done"] for g in got[:-1]) and got[-1]["done"] and got[-1]["done_reason"] == "stop"
        assert "".join(g["message"]["content"] for g in got) == "It is sunny in Paris."


def test_tool_calls_come_whole_with_object_arguments():
    engine = ScriptedEngine([XML_CALL, XML_CALL, "Sunny."])
    with RunningServer(engine) as server:
        body = {"model": "m", "messages": ASK, "tools": [WEATHER], "stream": False}
        (call,) = post(server, "/api/chat", body).json()["message"]["tool_calls"]
        assert call == {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
        got = lines(server, "/api/chat", {**body, "stream": True})
        calls = [c for g in got for c in g["message"].get("tool_calls", [])]
        assert calls == [call]
        # the call and its result back in the conversation, as Ollama's clients send them
        turn = [
            *ASK,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ]
        assert post(server, "/api/chat", {"model": "m", "messages": turn, "stream": False}).status_code == 200
        assert (
            '"arguments": {"city": "Paris", "days": 2}' in engine.prompts[-1]
            and "sunny" in engine.prompts[-1]
        )


def test_thinking_options_and_format_are_read():
    engine = ScriptedEngine(["Let me think.\n</think>\n\nFour."] * 3 + ['{"a": 1}'])
    with RunningServer(engine) as server:
        ask = [{"role": "user", "content": "2+2?"}]
        options = {"temperature": 0.2, "top_k": 5, "repeat_penalty": 1.1, "num_predict": 64, "stop": ["END"]}
        body = {"model": "m", "messages": ask, "think": True, "options": options, "stream": False}
        reply = post(server, "/api/chat", body).json()
        assert reply["message"] == {"role": "assistant", "content": "Four.", "thinking": "Let me think.\n"}
        params = engine.params[-1]
        assert (params.temperature, params.top_k, params.repetition_penalty, params.max_tokens) == (
            0.2,
            5,
            1.1,
            64,
        )
        assert list(params.stop) == ["END"]
        got = lines(server, "/api/chat", {**body, "options": {}, "stream": True})
        assert "".join(g["message"].get("thinking", "") for g in got) == "Let me think.\n"
        assert 4000 < engine.params[-1].max_tokens < 4096  # no num_predict: to the context limit
        many = {**body, "options": {"num_predict": 10**6}}
        assert post(server, "/api/chat", many).status_code == 200  # more than fits: to the context limit
        assert 4000 < engine.params[-1].max_tokens < 4096
        post(
            server,
            "/api/chat",
            {"model": "m", "messages": ask, "format": {"type": "object"}, "stream": False},
        )
        assert engine.params[-1].grammar is not None


def test_a_negative_seed_is_a_random_one_as_in_ollama():
    engine = ScriptedEngine(["a", "b"])
    with RunningServer(engine) as server:
        for seed, want in ((-1, None), (7, 7)):
            body = {"model": "m", "prompt": "Hi", "options": {"seed": seed}, "stream": False}
            assert post(server, "/api/generate", body).status_code == 200
            assert engine.params[-1].seed == want


def test_generate_templates_the_prompt_unless_raw():
    engine = ScriptedEngine(["Paris.", " Paris.", "x"])
    with RunningServer(engine) as server:
        body = {"model": "m", "prompt": "Capital of France?", "system": "Be brief.", "stream": False}
        reply = post(server, "/api/generate", body).json()
        assert reply["response"] == "Paris." and reply["done"] and "Be brief." in engine.prompts[-1]
        assert "<|im_start|>user\nCapital of France?" in engine.prompts[-1]
        got = lines(
            server, "/api/generate", {"model": "m", "prompt": "The capital of France is", "raw": True}
        )
        assert (
            "".join(g["response"] for g in got) == " Paris."
            and engine.prompts[-1] == "The capital of France is"
        )
        assert post(server, "/api/generate", {"model": "m"}).json()["done_reason"] == "load"  # nothing to run


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/api/chat", {"model": "m"}, "'messages' must be a non-empty array"),
        (
            "/api/chat",
            {"model": "m", "messages": ASK, "think": "max"},
            "'think' must be true, false or one of",
        ),
        (
            "/api/chat",
            {"model": "m", "messages": ASK, "format": "yaml"},
            "'format' must be \"json\" or a JSON schema",
        ),
        (
            "/api/chat",
            {"model": "m", "messages": [{"role": "user", "content": "x", "images": [1]}]},
            "base64 strings",
        ),
        (
            "/api/generate",
            {"model": "m", "prompt": "x", "context": [1, 2]},
            "'context' (an earlier reply's token ids)",
        ),
        ("/api/generate", {"model": "m", "prompt": "x", "suffix": "y"}, "fill-in-the-middle tokens"),
        (
            "/api/generate",
            {"model": "m", "prompt": "x", "template": "{{ .Prompt }}"},
            "'template' (a Go template)",
        ),
        ("/api/chat", {"model": "m", "messages": ASK, "keep_alive": "soon"}, "'keep_alive' must be"),
        ("/api/chat", {"model": "m", "messages": ASK, "tools": {}}, "'tools' must be"),
        ("/api/chat", {"model": "m", "messages": ASK, "tools": ""}, "'tools' must be"),
    ],
)
def test_bad_requests_are_refused_in_ollamas_shape(path, body, words):
    with RunningServer(ScriptedEngine(["unused"])) as server:
        r = post(server, path, {**body, "stream": False})
        assert r.status_code == 400 and set(r.json()) == {"error"} and words in r.json()["error"], r.text


def test_a_real_engine_chats_and_embeds():
    with RunningServer(AsyncLLM(max_context=2048), api_key="k") as server:
        headers = {"Authorization": "Bearer k"}
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        body = {
            "model": "smollm2",
            "messages": ask,
            "options": {"temperature": 0, "num_predict": 16},
            "stream": False,
        }
        r = httpx.post(server.url + "/api/chat", json=body, headers=headers, timeout=60)
        assert "Paris" in r.json()["message"]["content"]
        assert httpx.post(server.url + "/api/chat", json=body, timeout=60).status_code == 401
        r = httpx.post(
            server.url + "/api/embed",
            json={"model": "smollm2", "input": ["a cat", "a dog"]},
            headers=headers,
            timeout=60,
        )
        vectors = r.json()["embeddings"]
        assert len(vectors) == 2 and all(abs(sum(v * v for v in vec) - 1) < 1e-4 for vec in vectors)
        r = httpx.post(
            server.url + "/api/embeddings",
            json={"model": "smollm2", "prompt": "a cat"},
            headers=headers,
            timeout=60,
        )
        assert r.json()["embedding"] == pytest.approx(vectors[0], abs=1e-5)
        picture = [{"role": "user", "content": "What is this?", "images": ["aGk="]}]
        r = httpx.post(
            server.url + "/api/chat",
            json={"model": "smollm2", "messages": picture},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 400 and "takes no images" in r.json()["error"]


def test_keep_alive_zero_puts_the_model_to_sleep_and_an_empty_request_wakes_it():
    """Ollama's unload (`ollama stop`: nothing to run, keep_alive 0) is sleep level 1 here (the device
    memory given back); its load (nothing to run) wakes the model."""
    with RunningServer(AsyncLLM(max_context=1024)) as server:
        r = post(server, "/api/generate", {"model": "smollm2", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload" and r.json()["response"] == ""
        assert httpx.get(server.url + "/is_sleeping").json()["is_sleeping"]
        r = post(server, "/api/chat", {"model": "smollm2", "messages": []})
        assert r.json()["done_reason"] == "load" and r.json()["message"] == {
            "role": "assistant",
            "content": "",
        }
        assert not httpx.get(server.url + "/is_sleeping").json()["is_sleeping"]
        r = post(server, "/api/chat", {"model": "smollm2", "messages": [], "keep_alive": "0s"})
        assert r.json()["done_reason"] == "unload"
        body = {"model": "smollm2", "prompt": "Hi", "options": {"num_predict": 2}, "stream": False}
        assert post(server, "/api/generate", body).json()["done"]  # a request wakes it again
