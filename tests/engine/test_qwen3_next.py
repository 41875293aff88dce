"""Qwen3-Next (Qwen3NextForCausalLM): the Qwen3.5 hybrid with its linear layers' input projections fused and
interleaved per key-head group (engine/formats/qwen3_next.py), against transformers on tiny random
checkpoints: the split, log-probabilities, greedy generation, the MTP head, `ninfer convert`, and the
refusal of a checkpoint another tool quantized."""

from __future__ import annotations

import pytest
import torch
from conftest import hf_logprobs, mtp_head_tensors, save_mtp_head, save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.qwen3_next import split_ba, split_qkvz
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert

PROMPT = list(range(10, 40))
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def next_model(tmp_path_factory):
    model = tiny_hf_model("qwen3_next", tied=False)
    return model, save_tiny(model, tmp_path_factory.mktemp("qwen3_next"))


@pytest.mark.parametrize("value_heads", [4, 2])  # two value heads a key head, and one
def test_the_split_is_what_transformers_reads_out_of_the_fused_projections(value_heads):
    model = tiny_hf_model("qwen3_next", tied=False, linear_num_value_heads=value_heads)
    layer = model.model.layers[0].linear_attn
    config = ModelConfig.from_hf_dict(model.config.to_dict() | {"architectures": ["Qwen3NextForCausalLM"]})
    x = torch.randn(1, 3, model.config.hidden_size)
    with torch.no_grad():
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
        qkv_w, z_w = split_qkvz(layer.in_proj_qkvz.weight, config)
        b_w, a_w = split_ba(layer.in_proj_ba.weight, config)
    flat = torch.cat([t.reshape(1, 3, -1) for t in (q, k, v)], dim=-1)
    assert torch.allclose(x @ qkv_w.T, flat, atol=1e-6)
    assert torch.allclose(x @ z_w.T, z.reshape(1, 3, -1), atol=1e-6)
    assert torch.allclose(x @ b_w.T, b, atol=1e-6) and torch.allclose(x @ a_w.T, a, atol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"linear_num_value_heads": 2, "mlp_only_layers": []}])
def test_logprobs_match_transformers(tmp_path, overrides):
    model = tiny_hf_model("qwen3_next", tied=False, seed=1, **overrides)
    llm = LLM(save_tiny(model, tmp_path), weight_quant="none")
    assert llm.model_config.architecture == "Qwen3NextForCausalLM"
    config = llm.model_config
    assert config.num_linear_attention_layers == 3 and config.rotary_dim == config.head_dim // 4
    got = sequence_logprobs(llm, PROMPT)
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_greedy_generation_matches_transformers(next_model):
    """Two prompts at once: prefill, then decode steps through the paged KV cache and the recurrent state."""
    model, path = next_model
    prompts = [[5, 9, 200, 31, 77, 5, 9], list(range(40, 60))]
    got = LLM(path, weight_quant="none").generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    for prompt, out in zip(prompts, got):
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :]
        assert out.token_ids == want.tolist()


def test_the_mtp_head_drafts_and_the_output_stays(next_model, tmp_path):
    model, path = next_model
    mtp = tmp_path / "mtp"
    mtp.mkdir()
    for f in path.iterdir():
        (mtp / f.name).write_bytes(f.read_bytes())
    save_mtp_head(mtp, mtp_head_tensors(model))
    plain = LLM(mtp, weight_quant="none").generate(prompt_token_ids=[PROMPT], sampling_params=GREEDY)
    llm = LLM(mtp, weight_quant="none", spec="mtp", draft_tokens=2)
    drafted = llm.generate(prompt_token_ids=[PROMPT], sampling_params=GREEDY)
    assert drafted[0].token_ids == plain[0].token_ids
    assert llm.scheduler.num_draft_tokens > 0


def test_convert_writes_the_qwen3_5_layout(next_model, tmp_path):
    """The artifact holds the split projections: at bf16 every parameter loads as the checkpoint's, to bf16's
    rounding (a tiny random mixture of experts routes too close to call for its logprobs to tell); a
    quantized one loads and generates."""
    from engine.formats.container import load_container

    _, path = next_model
    convert(path, tmp_path / "bf16.ninfer", "bf16", method="rtn")
    names = {name for name, _ in load_container(tmp_path / "bf16.ninfer").weights()}
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in names
    assert not any("in_proj_qkvz" in n or "in_proj_ba" in n for n in names)
    want = dict(LLM(path, weight_quant="none").model.named_parameters())
    got = dict(LLM(tmp_path / "bf16.ninfer", weight_quant="none").model.named_parameters())
    assert got.keys() == want.keys()
    for name, param in got.items():
        assert torch.allclose(param.float(), want[name].float(), rtol=1e-2, atol=1e-3), name
    convert(path, tmp_path / "q.ninfer", "q4.6", method="rtn")
    out = LLM(tmp_path / "q.ninfer").generate(prompt_token_ids=[PROMPT], sampling_params=GREEDY)
    assert len(out[0].token_ids) == 8


def test_a_quantized_tensor_without_its_quantization_config_is_refused(next_model, tmp_path):
    _, path = next_model
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.0.linear_attn.in_proj_qkvz"
    tensors[f"{name}.qweight"] = tensors.pop(f"{name}.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(
        NinferError,
        match=f"^{name}.qweight: a quantized layer's tensor, but the checkpoint's config.json names no",
    ):
        LLM(tmp_path, weight_quant="none")


def test_plan_counts_what_the_converted_artifact_holds(next_model, tmp_path):
    """`ninfer plan` on the HF directory predicts what the w4g128 artifact holds, kind by kind; the tiny
    model's b / a projections (4 rows, under the recipes' 16-row minimum: unquantized, unlike a real model's)
    put the linear layers within 10%, as they do Qwen3.5's."""
    from engine.plan.weights import artifact_weight_bytes, recipe_weight_bytes

    _, path = next_model
    convert(path, tmp_path / "m.ninfer", "w4g128", method="rtn")
    config = LLM(path, weight_quant="none").model_config
    predicted = recipe_weight_bytes(config, "w4g128", dtype_bytes=2)
    held = artifact_weight_bytes(tmp_path / "m.ninfer", config, dtype_bytes=2)
    linear = "linear attention"
    assert {k: v for k, v in predicted.items() if k != linear} == {
        k: v for k, v in held.items() if k != linear
    }
    assert abs(predicted[linear] - held[linear]) < 0.1 * held[linear]
