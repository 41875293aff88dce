"""Code completion on a real engine: a tiny random Qwen3 over a tokenizer with Qwen's FIM tokens, served.
/infill, the OpenAI completions' `suffix` and /completion agree on the same prompt; the FIM tokens end a
middle without showing in it; n_predict 0 warms the prefix cache; n_probs, grammars."""

from __future__ import annotations

import json
import math

import httpx2 as httpx
import openai
import pytest
from conftest import save_tiny, tiny_hf_model
from server import RunningServer

from engine.async_llm import AsyncLLM

PREFIX = "def area(radius):\n    pi = 3.14159\n    "
SUFFIX = "\n    return result\n\nprint(area(2.0))\n"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, fim_tokenizer):
    path = tmp_path_factory.mktemp("fim")
    save_tiny(tiny_hf_model("qwen3", tied=False, vocab_size=fim_tokenizer.vocab_size), path)
    fim_tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": fim_tokenizer.eos_token}))
    with RunningServer(AsyncLLM(path, max_concurrency=2)) as s:
        yield s


def _post(server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_infill_suffix_and_completion_agree_on_the_same_prompt(server):
    infill = _post(
        server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, **GREEDY}
    )
    assert infill["tokens_predicted"] > 0
    with httpx.stream(
        "POST",
        f"{server.url}/infill",
        json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "stream": True, **GREEDY},
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == infill["content"] and events[-1]["stop"] is True
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    suffixed = oai.completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=12, **GREEDY)
    assert suffixed.choices[0].text == infill["content"]
    # /completion reads the infill's own prompt (its text, FIM tokens and all) the same way
    raw = _post(server, "/completion", {"prompt": infill["prompt"], "n_predict": 12, **GREEDY})
    assert raw["tokens_evaluated"] == infill["tokens_evaluated"]
    if infill["stop_type"] == "limit":  # (a FIM token would end the infill, not the raw completion)
        assert raw["content"] == infill["content"]


def test_a_fim_token_ends_the_middle_and_stays_out_of_it(server):
    sep = server.engine.tokenizer.token_to_id("<|file_sep|>")
    forced = {"n_predict": 8, "logit_bias": [[sep, 100]], **GREEDY}
    infill = _post(server, "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, **forced})
    assert infill["content"] == "" and infill["tokens_predicted"] == 1 and infill["stop_type"] == "eos"
    # a plain completion has no FIM stops: the token is text there, and the reply runs to its limit
    raw = _post(server, "/completion", {"prompt": "x = 1", **forced, "return_tokens": True})
    assert raw["tokens"] == [sep] * 8 and raw["content"] == "<|file_sep|>" * 8 and raw["stop_type"] == "limit"
    # a caller's own stop token that is plain text ends the reply without its text, as in vLLM
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    r = oai.completions.create(
        model="m",
        prompt="x = 1",
        max_tokens=8,
        logit_bias={str(sep): 100},
        extra_body={"stop_token_ids": [sep]},
        **GREEDY,
    )
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1


def test_n_predict_0_warms_the_prefix_cache(server):
    prefix = "".join(f"value_{i} = {i} * {i}\n" for i in range(12))
    warm = _post(server, "/infill", {"input_prefix": prefix, "input_suffix": "", "n_predict": 0})
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["tokens_cached"] == 0
    assert warm["generation_settings"]["n_predict"] == 0
    hot = _post(server, "/infill", {"input_prefix": prefix + "x = ", "input_suffix": "", "n_predict": 4})
    assert hot["tokens_cached"] >= 16 and hot["timings"]["cache_n"] == hot["tokens_cached"]
    assert hot["timings"]["prompt_n"] == hot["tokens_evaluated"] - hot["tokens_cached"]


def test_n_probs_lists_each_tokens_alternatives(server):
    out = _post(server, "/completion", {"prompt": "x = 1", "n_predict": 4, "n_probs": 3, **GREEDY})
    probs = out["completion_probabilities"]
    assert len(probs) == out["tokens_predicted"] == 4
    for p in probs:
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]  # greedy: the top one
        assert math.isclose(p["logprob"], p["top_logprobs"][0]["logprob"]) and p["logprob"] <= 0
        assert bytes(p["bytes"]).decode() == p["token"]


def test_grammars_hold_the_reply(server):
    yes_no = _post(
        server, "/completion", {"prompt": "ok?", "n_predict": 8, "grammar": 'root ::= "yes" | "no"'}
    )
    assert yes_no["content"] in ("yes", "no")
    color = _post(
        server, "/completion", {"prompt": "c:", "n_predict": 8, "json_schema": {"enum": ["red", "blue"]}}
    )
    assert color["content"] in ('"red"', '"blue"') and color["stop_type"] == "eos"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}
    held = _post(server, "/completion", {"prompt": "n:", "n_predict": 40, "json_schema": schema, **GREEDY})
    assert held["content"].replace(" ", "").startswith(('{"n":', "{}"))
    r = httpx.post(f"{server.url}/completion", json={"prompt": "x", "grammar": "start: ((("}, timeout=60)
    assert r.status_code == 400 and "\n" not in r.json()["error"]["message"]


def test_a_stop_string_that_is_a_special_token_stops_there(server):
    """A raw-FIM client (prompt written with the FIM tokens itself) stops on "<|endoftext|>": a special
    token, left out of the text, so it stops as that token."""
    eot = server.engine.tokenizer.token_to_id("<|endoftext|>")
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    ask = {
        "model": "m",
        "prompt": "<|fim_prefix|>a = <|fim_suffix|><|fim_middle|>",
        "max_tokens": 6,
        **GREEDY,
    }
    forced = {**ask, "logit_bias": {str(eot): 100}}
    stopped = oai.completions.create(**forced, stop=["<|endoftext|>", "<|file_sep|>"]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == ""
    assert oai.completions.create(**forced).choices[0].finish_reason == "length"  # no such stop: runs on


def test_an_editor_window_that_slid_is_taken_from_the_cache(tmp_path, fim_tokenizer):
    """llama.vim's requests with `serve --cache-reuse`: the extra context's first chunk goes (the ring moved
    on), the rest of the prompt comes from the last request's pages at shifted positions."""
    save_tiny(tiny_hf_model("qwen3", tied=False, vocab_size=fim_tokenizer.vocab_size), tmp_path)
    fim_tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": fim_tokenizer.eos_token}))
    chunks = [
        {"filename": f"m{i}.py", "text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 6}
        for i in range(3)
    ]
    local = {"input_prefix": PREFIX * 4, "input_suffix": SUFFIX, "n_predict": 4, **GREEDY}
    with RunningServer(AsyncLLM(tmp_path, cache_reuse=32)) as s:
        first = _post(s, "/infill", {**local, "input_extra": chunks})
        slid = _post(s, "/infill", {**local, "input_extra": chunks[1:]})
    dropped = first["tokens_evaluated"] - slid["tokens_evaluated"]
    assert dropped > 32
    # the shared start (the repository header) as it was, the rest past the dropped chunk from the first
    # request's pages at shifted positions: all but the prompt's last token (and what lay in the first
    # request's last page, unnamed, should it have stopped at once)
    assert slid["tokens_evaluated"] - 16 <= slid["tokens_cached"] < slid["tokens_evaluated"]
