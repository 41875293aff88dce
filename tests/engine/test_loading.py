"""Checkpoint layouts: the multimodal Qwen3.5 layout, mtp tensors, HF tokenizer files, missing tensors, dtypes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

from engine import LLM, NinferError, SamplingParams
from engine.models.loader import default_model_path, open_source

PROMPT = [4, 80, 19, 300, 2, 45, 46]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3_5", tied=False), tmp_path_factory.mktemp("q35"))


def test_multimodal_layout_with_mtp_and_vision_tensors(qwen35_dir, tmp_path):
    """Qwen3_5ForConditionalGeneration checkpoints nest the text model and carry mtp.* and model.visual.*."""
    tensors = load_file(str(qwen35_dir / "model.safetensors"))
    nested = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    nested["mtp.fc.weight"] = torch.randn(64, 128)
    nested["mtp.norm.weight"] = torch.randn(64)
    nested["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3)
    save_file(nested, str(tmp_path / "model.safetensors"))
    text_cfg = json.loads((qwen35_dir / "config.json").read_text())
    cfg = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_cfg,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    nested_llm, plain_llm = LLM(tmp_path), LLM(qwen35_dir)  # mtp.* skipped without spec mtp
    assert nested_llm.model.mtp is None
    a = nested_llm.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    b = plain_llm.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert a.token_ids == b.token_ids


def test_missing_tensor_is_named(qwen35_dir, tmp_path):
    tensors = load_file(str(qwen35_dir / "model.safetensors"))
    del tensors["model.layers.2.self_attn.k_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((qwen35_dir / "config.json").read_text())
    with pytest.raises(NinferError, match=r"lacks model\.layers\.2\.self_attn\.qkv_proj\.weight \[k\]"):
        LLM(tmp_path)


def test_tensors_with_no_place_are_named_and_a_real_bias_refused(qwen35_dir, tmp_path, caplog):
    """A checkpoint tensor the model has no parameter for: a zero bias (AutoGPTQ saves one for every layer)
    is dropped quietly; one that is not zero is refused (the layer would run without it); anything else is
    named in one warning, the rest loaded as ever."""
    tensors = load_file(str(qwen35_dir / "model.safetensors"))
    (tmp_path / "config.json").write_text((qwen35_dir / "config.json").read_text())
    out = {**tensors, "model.layers.0.mlp.down_proj.bias": torch.zeros(64)}
    out["model.layers.1.mlp.extra_scale"] = torch.ones(64)
    save_file(out, str(tmp_path / "model.safetensors"))
    with caplog.at_level("WARNING", logger="ninfer"):
        llm = LLM(tmp_path)
    warned = [r.getMessage() for r in caplog.records if "no place for" in r.getMessage()]
    assert warned == [
        "ignored 1 checkpoint tensor(s) this Qwen3_5ForCausalLM model has no place for: "
        "model.layers.1.mlp.extra_scale"
    ]
    want = LLM(qwen35_dir).generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids
    assert llm.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0].token_ids == want
    out["model.layers.0.mlp.down_proj.bias"] = torch.full((64,), 0.5)
    save_file(out, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        NinferError, match=r"model\.layers\.0\.mlp\.down_proj\.bias is a bias this .* config has no"
    ):
        LLM(tmp_path)


def test_wrong_shape_says_config_and_checkpoint_disagree(qwen35_dir, tmp_path):
    cfg = json.loads((qwen35_dir / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((qwen35_dir / "model.safetensors").read_bytes())
    with pytest.raises(NinferError, match="checkpoint and its config.json disagree"):
        LLM(tmp_path)


def test_hf_dir_tokenizer_and_chat_template(tmp_path):
    """A Llama HF directory with tokenizer.json + tokenizer_config.json chats like the GGUF it came from."""
    tok = open_source(default_model_path()).tokenizer
    save_tiny(tiny_hf_model("llama", tied=True, vocab_size=tok.vocab_size), tmp_path)
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": tok.chat_template,
                "eos_token": "<|im_end|>",
                "bos_token": {"content": "<|im_start|>"},
            }
        )
    )

    llm = LLM(tmp_path)
    messages = [{"role": "user", "content": "Hi"}]
    assert llm.tokenizer.encode_chat(messages) == tok.encode_chat(messages)
    assert llm.tokenizer.eos_token_ids == (2,)
    out = llm.chat(messages, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 5 and isinstance(out.text, str)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_close_to_fp32(qwen35_dir, dtype):
    ref = LLM(qwen35_dir).generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    out = LLM(qwen35_dir, dtype=dtype).generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    first = out.token_ids[0]
    assert abs(out.logprobs[0][first] - ref.logprobs[0].get(first, out.logprobs[0][first])) < 0.1


def test_unknown_dtype():
    with pytest.raises(NinferError, match="unknown dtype 'fp8'"):
        LLM(dtype="fp8")


def test_token_ids_passed_as_prompts_are_refused_in_one_line():
    llm = LLM(max_concurrency=1)
    with pytest.raises(
        NinferError, match="prompts are strings \\(got list\\); pass token ids as prompt_token_ids="
    ):
        llm.generate([[1, 2, 3]])
    assert not llm.has_unfinished_requests()
