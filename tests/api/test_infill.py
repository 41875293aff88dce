"""Code completion over HTTP with a scripted engine double (the protocol layer under test): llama.cpp's
/infill and /completion, and the OpenAI completions' `suffix`. The prompt each builds is read back from the
double; the replies are scripted text."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx2 as httpx
import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.fim import fim_tokens

PREFIX, SUFFIX = "def area(r):\n    ", "\n    return a\n"
PSM = "<|fim_prefix|>def area(r):\n    <|fim_suffix|>\n    return a\n<|fim_middle|>"


@pytest.fixture
def serve(fim_tokenizer):
    """serve(replies, fim=True, **server options): a running server over a scripted engine whose tokenizer
    has Qwen's FIM tokens (or not)."""
    running = []

    def start(replies, fim=True, **options):
        engine = ScriptedEngine(replies)
        if fim:
            engine.tokenizer = replace(fim_tokenizer, chat_template=engine.tokenizer.chat_template)
        server = RunningServer(engine, **options).__enter__()
        running.append(server)
        return server

    yield start
    for server in running:
        server.__exit__(None, None, None)


def _events(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_infill_lays_out_the_gap_and_answers_as_llama_cpp(serve, fim_tokenizer):
    server = serve(["a = 3.14 * r * r"])
    r = httpx.post(
        f"{server.url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 64}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert server.engine.prompts == [PSM]
    assert body["content"] == "a = 3.14 * r * r" and body["stop"] is True and body["stop_type"] == "eos"
    assert body["truncated"] is False and body["has_new_line"] is False and body["model"] == "smollm2"
    assert body["tokens_evaluated"] == len(fim_tokenizer.encode(PSM)) and body["tokens_predicted"] > 0
    assert body["prompt"] == PSM and body["tokens"] == []
    assert body["generation_settings"]["n_predict"] == 64
    timings = body["timings"]
    assert (
        timings["predicted_n"] == body["tokens_predicted"] and timings["prompt_n"] == body["tokens_evaluated"]
    )
    assert timings["prompt_ms"] >= 0 and timings["predicted_ms"] >= 0
    # the middle ends at any FIM or file token, on top of the caller's own
    params = server.engine.params[0]
    assert set(fim_tokens(fim_tokenizer).stop_token_ids) <= set(params.stop_token_ids)
    assert params.max_tokens == 64


def test_infill_with_other_files_and_a_start_of_the_middle(serve):
    server = serve(["r * r"])
    extra = [{"filename": "util.py", "text": "PI = 3.14\n"}]
    body = {"input_prefix": "a = ", "input_suffix": "", "input_extra": extra, "prompt": "PI * "}
    r = httpx.post(f"{server.url}/infill", json=body)
    assert r.status_code == 200, r.text
    assert server.engine.prompts == [
        "<|repo_name|>project\n<|file_sep|>util.py\nPI = 3.14\n<|file_sep|>file\n"
        "<|fim_prefix|>a = <|fim_suffix|><|fim_middle|>PI * "
    ]


def test_infill_cuts_what_does_not_fit_and_says_so(serve):
    server = serve(["x"])
    long_prefix = "".join(f"line{i} = {i}\n" for i in range(3000))
    r = httpx.post(
        f"{server.url}/infill", json={"input_prefix": long_prefix, "input_suffix": "", "n_predict": 16}
    )
    assert r.status_code == 200, r.text
    assert r.json()["truncated"] is True and r.json()["tokens_evaluated"] <= 4096 - 1 - 16
    # the prefix's start went, its end (nearest the gap) stayed
    assert (
        "line2999 = 2999\n<|fim_suffix|>" in server.engine.prompts[0]
        and "line0 =" not in server.engine.prompts[0]
    )


def test_n_indent_ends_the_middle_at_a_line_indented_less(serve):
    reply = "total = 0\n    for x in xs:\n        total += x\nprint(total)\n"
    server = serve([reply, reply])
    body = {"input_prefix": "def f(xs):\n    ", "input_suffix": "", "n_indent": 4}
    plain = httpx.post(f"{server.url}/infill", json=body).json()
    assert plain["content"] == "total = 0\n    for x in xs:\n        total += x\n"
    assert plain["stop_type"] == "limit"
    with httpx.stream("POST", f"{server.url}/infill", json={**body, "stream": True}) as r:
        events = _events(r)
    assert "".join(e["content"] for e in events) == plain["content"]
    assert [e["stop"] for e in events].count(True) == 1 and events[-1]["stop"] is True
    assert events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] > 0


def test_n_indent_cuts_a_line_that_comes_with_the_end(serve):
    """The whole reply in one piece (as a step of accepted drafts brings it): the line is cut still."""
    reply = "total = 0\nprint(total)"
    server = serve([reply])
    server.engine.piece = len(reply)
    out = httpx.post(f"{server.url}/infill", json={"input_prefix": "    ", "n_indent": 4}).json()
    assert out["content"] == "total = 0\n" and out["stop_type"] == "limit"


def test_n_indent_reads_crlf_lines():
    from engine.api.infill_limits import InfillLimits

    limits = InfillLimits(n_indent=4)
    text = "x = 1\r\n\r\n    y = 2\r\nz = 3\r\n"
    assert limits.cut_at(text) == text.index("z")  # the blank CRLF line does not end it
    assert limits.sendable("x = 1\r\n  \r") == len("x = 1\r\n")


def test_t_max_predict_ms_ends_the_middle_after_a_newline(serve, monkeypatch):
    import engine.api.llama_cpp as llama_cpp

    clock = iter(range(0, 10**6, 1))  # each reading is a second later than the last
    monkeypatch.setattr(llama_cpp.time, "perf_counter", lambda: float(next(clock)))
    server = serve(["first line\nsecond line\nthird line\n"])
    body = {"input_prefix": "", "input_suffix": "", "t_max_predict_ms": 500}
    out = httpx.post(f"{server.url}/infill", json=body).json()
    assert out["stop_type"] == "limit" and out["content"].startswith("first line\n")
    assert out["content"] != "first line\nsecond line\nthird line\n"


def test_response_fields_and_return_tokens(serve):
    server = serve(["abc", "abc"])
    body = {
        "input_prefix": "x",
        "input_suffix": "y",
        "return_tokens": True,
        "response_fields": ["content", "timings/predicted_n", "tokens", "no_such_field"],
    }
    out = httpx.post(f"{server.url}/infill", json=body).json()
    assert set(out) == {"content", "timings/predicted_n", "tokens"}
    assert out["content"] == "abc" and out["timings/predicted_n"] == len(out["tokens"]) > 0


def test_completion_takes_text_and_token_ids_mixed(serve, fim_tokenizer):
    server = serve(["one", "two words here"])
    ids = fim_tokenizer.encode(" world", add_special_tokens=False)
    r = httpx.post(f"{server.url}/completion", json={"prompt": ["hello", *ids, "!"], "n_predict": 8})
    assert r.status_code == 200, r.text
    assert server.engine.prompts == ["hello world!"] and r.json()["content"] == "one"
    with httpx.stream("POST", f"{server.url}/completion", json={"prompt": "hi", "stream": True}) as s:
        events = _events(s)
    assert "".join(e["content"] for e in events) == "two words here" and events[-1]["stop"] is True
    assert all(e["stop"] is False for e in events[:-1]) and len(events) > 2
    assert events[-1]["timings"]["predicted_n"] == events[-1]["tokens_predicted"]


def test_llama_cpp_sampling_fields_map_onto_the_engines(serve):
    server = serve(["x"])
    body = {
        "prompt": "hi",
        "n_predict": 5,
        "temperature": 0.2,
        "top_k": 7,
        "top_p": 0.5,
        "min_p": 0.1,
        "repeat_penalty": 1.3,
        "seed": -1,
        "stop": ["\n\n"],
        "logit_bias": [[5, 2.0], [6, False], ["hi", -1.5]],
        "cache_prompt": True,
        "samplers": ["top_k", "temperature"],
    }
    assert httpx.post(f"{server.url}/completion", json=body).status_code == 200
    params = server.engine.params[0]
    assert (params.max_tokens, params.temperature, params.top_k, params.top_p) == (5, 0.2, 7, 0.5)
    assert (params.min_p, params.repetition_penalty, params.seed, params.stop) == (0.1, 1.3, None, ("\n\n",))
    bias = dict(params.logit_bias)
    hi = server.engine.tokenizer.encode("hi", add_special_tokens=False)
    assert bias[5] == 2.0 and bias[6] == -100.0 and all(bias[t] == -1.5 for t in hi)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/infill", {"input_prefix": 3}, "'input_prefix' must be a string"),
        ("/infill", {"input_extra": [{"filename": "a"}]}, "'input_extra' must be an array of"),
        ("/infill", {"input_extra": "a.py"}, "'input_extra' must be an array"),
        ("/infill", {"n_predict": -2}, "'n_predict' must be -1 (no limit), 0 or more"),
        ("/infill", {"n_predict": 5000}, "n_predict 5000 is beyond the context limit 4096"),
        ("/completion", {"prompt": [["a"], "b"]}, "'prompt' must be a string, an array of token ids"),
        ("/completion", {"prompt": ""}, "the prompt is empty"),
        ("/completion", {"prompt": "x", "logit_bias": [[1]]}, "'logit_bias' must be [["),
        ("/completion", {"prompt": "x", "n_probs": -1}, "'n_probs' must be 0 or more"),
        ("/completion", {"prompt": "x", "stop": "\n"}, "'stop' must be an array"),
        ("/completion", {"prompt": "x", "grammar": "root ::= [a-z]+", "json_schema": {}}, "ask for one"),
        ("/completion", {"prompt": "x", "grammar": "root ::= [a-z", "n_predict": 3}, "neither Lark nor GBNF"),
        ("/completion", {"prompt": "x", "response_fields": [1]}, "'response_fields' must be an array"),
    ],
)
def test_bad_requests_get_one_line(serve, path, body, message):
    server = serve(["never"])
    r = httpx.post(f"{server.url}{path}", json=body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and "\n" not in r.json()["error"]["message"]
    assert server.engine.prompts == []  # nothing was queued


def test_a_model_without_fim_tokens_is_told_what_infill_needs(serve):
    server = serve(["x"], fim=False)
    r = httpx.post(f"{server.url}/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 400 and "no fill-in-the-middle tokens" in r.json()["error"]["message"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="Qwen2.5-Coder"):
        client.completions.create(model="m", prompt="a", suffix="b")


def test_openai_completions_suffix_is_fill_in_the_middle(serve, fim_tokenizer):
    server = serve(["a = 3.14 * r * r", "x", "y"])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    r = client.completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=32)
    assert r.choices[0].text == "a = 3.14 * r * r" and server.engine.prompts == [PSM]
    assert set(fim_tokens(fim_tokenizer).stop_token_ids) <= set(server.engine.params[0].stop_token_ids)
    # several prompts: each is the code before the same gap; token-id prompts as they are
    ids = fim_tokenizer.encode("b = ", add_special_tokens=False)
    client.completions.create(model="m", prompt=[ids, "c = "], suffix="", max_tokens=4)
    assert server.engine.prompts[1:] == [
        "<|fim_prefix|>b = <|fim_suffix|><|fim_middle|>",
        "<|fim_prefix|>c = <|fim_suffix|><|fim_middle|>",
    ]
    with pytest.raises(openai.BadRequestError, match="'echo' cannot be combined with 'suffix'"):
        client.completions.create(model="m", prompt="a", suffix="b", echo=True)


def test_the_llama_cpp_routes_are_behind_the_api_key(serve):
    server = serve(["ok"], api_key="k")
    body = {"input_prefix": "a", "input_suffix": "b"}
    assert httpx.post(f"{server.url}/infill", json=body).status_code == 401
    assert httpx.post(f"{server.url}/completion", json={"prompt": "a"}).status_code == 401
    assert httpx.get(f"{server.url}/props").status_code == 401
    assert (
        httpx.post(f"{server.url}/infill", json=body, headers={"Authorization": "Bearer k"}).status_code
        == 200
    )


def test_a_model_without_a_tokenizer_takes_token_ids_only(serve):
    server = serve(["x", "y"], fim=False)
    server.engine.tokenizer = None
    r = httpx.post(f"{server.url}/completion", json={"prompt": "text"})
    assert r.status_code == 400 and "takes token ids, not text" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/infill", json={"input_prefix": "a"})
    assert r.status_code == 400 and "this model has no tokenizer" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "text", "max_tokens": 2})
    assert r.status_code == 400 and "takes token ids, not text" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/completion", json={"prompt": [1, 2, 3], "n_predict": 2})
    assert r.status_code == 200 and r.json()["prompt"] == ""
