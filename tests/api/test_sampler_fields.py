"""llama.cpp's sampling fields (DRY, XTC, typical_p, top_n_sigma, dynamic temperature, repeat_last_n) reach
the engine from llama-server's /completion and from the OpenAI routes (as llama-server takes them there
too); llama.cpp's own generation_settings echo them; out-of-range values are refused."""

from __future__ import annotations

import httpx2 as httpx
import openai
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer

FIELDS = {
    "typical_p": 0.9,
    "top_n_sigma": 1.5,
    "xtc_probability": 0.5,
    "xtc_threshold": 0.2,
    "dry_multiplier": 0.8,
    "dry_base": 2.0,
    "dry_allowed_length": 3,
    "dry_penalty_last_n": 512,
    "dry_sequence_breakers": ["\n", "###"],
    "repeat_last_n": 64,
    "dynatemp_range": 0.3,
    "dynatemp_exponent": 1.5,
    "mirostat": 2,
    "mirostat_tau": 4.0,
    "mirostat_eta": 0.2,
}


@pytest.fixture
def server():
    with RunningServer(ScriptedEngine(["x y"])) as s:
        yield s


def _check(params):
    for name, value in FIELDS.items():
        got = getattr(params, name)
        assert (list(got) if isinstance(got, tuple) else got) == value, name


def test_completion_takes_them_and_echoes_them(server):
    r = httpx.post(f"{server.url}/completion", json={"prompt": "hi", "n_predict": 4, **FIELDS})
    assert r.status_code == 200, r.text
    _check(server.engine.params[0])
    settings = r.json()["generation_settings"]
    assert {name: settings[name] for name in FIELDS} == FIELDS


def test_chat_completions_take_them_as_extra_fields(server):
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body=FIELDS
    )
    _check(server.engine.params[0])


def test_left_out_they_are_off(server):
    httpx.post(f"{server.url}/completion", json={"prompt": "hi", "n_predict": 4})
    params = server.engine.params[0]
    assert not params.uses_dry and params.typical_p == 1.0 and params.xtc_probability == 0.0
    assert params.repeat_last_n is None and params.dynatemp_range == 0.0 and params.top_n_sigma <= 0
    assert params.mirostat == 0


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/completion", {"mirostat": 3}, "mirostat must be 0 (off), 1 or 2 (got 3)"),
        ("/v1/completions", {"mirostat": 2, "mirostat_tau": 0}, "mirostat_tau and mirostat_eta must be > 0"),
        ("/completion", {"typical_p": 0}, "typical_p must be in (0, 1]"),
        ("/completion", {"dry_multiplier": 1, "dry_base": 0.5}, "dry_base must be >= 1"),
        ("/completion", {"dry_sequence_breakers": "\n"}, "'dry_sequence_breakers' must be an array"),
        ("/v1/completions", {"repeat_last_n": -3}, "repeat_last_n must be -1"),
        ("/v1/completions", {"xtc_threshold": "high"}, "'xtc_threshold' must be a number"),
    ],
)
def test_bad_values_are_refused_in_one_line(server, path, body, message):
    r = httpx.post(f"{server.url}{path}", json={"prompt": "hi", "model": "m", **body})
    assert r.status_code == 400, r.text
    text = r.text
    assert message in text and "\n" not in r.json().get("error", {}).get("message", "x")
    assert not server.engine.params
