"""What a checkpoint recommends beside its weights: sampling defaults (generation_config.json, GGUF
general.sampling.*, kept by .ninfer) and the chat template, each replaceable (--generation-config,
--chat-template)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from conftest import byte_tokenizer, save_tiny, tiny_hf_model

from engine import LLM
from engine.api.common import sampling_params
from engine.api.errors import ApiError
from engine.chat_template import parse_template_kwargs
from engine.config import EngineConfig
from engine.errors import NinferError
from engine.formats import gguf as gguf_format
from engine.formats.container import tokenizer_from_json, tokenizer_to_json
from engine.models.loader import default_model_path, open_source
from engine.sampling_defaults import from_generation_config, resolve
from engine.tokenizer import with_chat_template, with_template_kwargs

QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [2, 3]}


def test_generation_config_fields_are_read():
    assert from_generation_config(QWEN3_GENERATION) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    odd = {"temperature": "hot", "top_k": 20.0, "min_p": float("nan"), "repetition_penalty": 1.05}
    assert from_generation_config(odd) == {"top_k": 20, "repetition_penalty": 1.05}


def test_a_container_keeps_them_with_its_tokenizer():
    tok = open_source(default_model_path()).tokenizer
    assert tok.sampling_defaults == {}  # the embedded GGUF has no general.sampling keys
    kept = tokenizer_from_json(
        tokenizer_to_json(replace(tok, sampling_defaults={"top_k": 20, "temperature": 0.7}))
    )
    assert kept.sampling_defaults == {"top_k": 20, "temperature": 0.7}


def test_a_saved_checkpoint_and_the_flag(tmp_path):
    path = save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path / "m")
    (path / "generation_config.json").write_text(json.dumps(QWEN3_GENERATION))
    (path / "tokenizer.json").write_text(byte_tokenizer().backend.to_str())
    llm = LLM(path)
    assert llm.sampling_defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert LLM(path, generation_config="none").sampling_defaults == {}
    other = tmp_path / "mine.json"
    other.write_text(json.dumps({"temperature": 0.2}))
    assert LLM(path, generation_config=str(other)).sampling_defaults == {"temperature": 0.2}
    with pytest.raises(NinferError, match="--generation-config nowhere.json: no such file"):
        LLM(path, generation_config="nowhere.json")
    other.write_text("[1, 2]")
    with pytest.raises(NinferError, match="must hold a JSON object"):
        resolve(str(other), {})
    # vLLM's --override-generation-config: laid over the generation config's fields
    over = LLM(path, override_generation_config='{"temperature": 0.3, "min_p": 0.05}')
    assert over.sampling_defaults == {"temperature": 0.3, "top_p": 0.95, "top_k": 20, "min_p": 0.05}
    assert LLM(path, override_generation_config={"top_k": 5}).sampling_defaults["top_k"] == 5
    for bad, message in (
        ('{"temp": 1}', "sets temp, which ninfer does not default; it takes temperature, top_p"),
        ('{"top_k": "x"}', "top_k must be numbers"),
        ("temperature=1", "is not JSON"),
        ("[1]", "takes a JSON object"),
    ):
        with pytest.raises(NinferError, match=message):
            EngineConfig(model="", override_generation_config=bad)
    with pytest.raises(NinferError, match="threads must be a whole number of 1 or more"):
        EngineConfig(model="", threads=0)


def test_gguf_sampling_keys(tmp_path):
    path = tmp_path / "s.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_array("tokenizer.ggml.merges", [])
    writer.add_float32("general.sampling.temp", 0.7)
    writer.add_int32("general.sampling.top_k", 40)
    writer.add_float32("general.sampling.min_p", 0.05)
    writer.add_tensor("x", np.zeros(1, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tok = gguf_format._build_tokenizer(gguf.GGUFReader(str(path)))
    assert tok.sampling_defaults == pytest.approx({"temperature": 0.7, "top_k": 40, "min_p": 0.05})


def test_requests_take_the_defaults_for_the_fields_they_leave_out():
    state = SimpleNamespace(
        sampling_defaults={"temperature": 0.6, "top_k": 20, "top_p": 0.95}, adapter_for=lambda body: {}
    )
    left_out = sampling_params(state, {}, "max_tokens", 16, None)
    assert (left_out.temperature, left_out.top_k, left_out.top_p, left_out.min_p) == (0.6, 20, 0.95, 0.0)
    given = sampling_params(state, {"temperature": 0, "top_k": 0}, "max_tokens", 16, None)
    assert (given.temperature, given.top_k, given.top_p) == (0.0, 0, 0.95)
    plain = sampling_params(
        SimpleNamespace(sampling_defaults={}, adapter_for=lambda body: {}), {}, "max_tokens", 16, None
    )
    assert (plain.temperature, plain.top_k, plain.top_p) == (1.0, 0, 1.0)
    with pytest.raises(ApiError, match="temperature"):
        sampling_params(state, {"temperature": "warm"}, "max_tokens", 16, None)


def test_a_chat_template_file_replaces_the_checkpoints(tmp_path):
    tok = open_source(default_model_path()).tokenizer
    assert with_chat_template(tok, None) is tok
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] ")
    mine = with_chat_template(tok, str(file))
    assert mine.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant] "
    file.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(NinferError, match=r"--chat-template .*t.jinja does not render a conversation") as e:
        with_chat_template(tok, str(file))
    assert "\n" not in str(e.value)
    with pytest.raises(NinferError, match="--chat-template nowhere.jinja: cannot read it"):
        with_chat_template(tok, "nowhere.jinja")


def test_template_kwargs_lie_under_a_renders_own(tmp_path):
    tok = open_source(default_model_path()).tokenizer
    assert with_template_kwargs(tok, ()) is tok
    file = tmp_path / "t.jinja"
    file.write_text("{{ a | default('-') }} {{ b | default('-') }}")
    mine = with_template_kwargs(with_chat_template(tok, str(file)), parse_template_kwargs('{"a": 1, "b": 2}'))
    assert mine.apply_chat_template([]) == "1 2" and mine.apply_chat_template([], b=3) == "1 3"
    assert tok.template_kwargs == {}  # the checkpoint's tokenizer is unchanged
    with pytest.raises(NinferError, match="--chat-template-kwargs needs a chat template"):
        with_template_kwargs(replace(tok, chat_template=None), (("a", 1),))
    with pytest.raises(NinferError, match="sets bos_token, which the renderer sets itself"):
        parse_template_kwargs({"bos_token": "<s>"})
