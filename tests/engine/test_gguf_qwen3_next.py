"""Qwen3-Next GGUF files (llama.cpp's `qwen3next`): a tiny transformers model written as llama.cpp's
converter writes it (in_proj_qkvz split into attn_qkv | attn_gate, or, as an older file holds it, whole as
ssm_in; in_proj_ba whole as ssm_ba; 1 + w norms, -exp(A_log), the squeezed conv1d, experts stacked, no MTP
head) loads back as the checkpoint, generates transformers' greedy tokens, keeps block-quantized matrices
packed on the Triton path (each part of ssm_ba its rows) and is counted by the planner as loaded."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from conftest import hf_greedy_reference, tiny_hf_model
from test_gguf_qwen35 import INTERVAL, add_hybrid_keys, close_gguf, gguf_writer

from engine import LLM, SamplingParams
from engine.formats.gguf import gpu_tensors, load_gguf
from engine.formats.qwen3_next import split_qkvz
from engine.plan.weights import held_weight_bytes

# the Triton-forced engines: on the GPU where there is one (the interpreter runs them only on the CPU), in
# fp32 there as here, so their tokens compare with the CPU reference's
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = dict(device=DEVICE, dtype="float32")

Q = gguf.GGMLQuantizationType
PROMPT = [4, 80, 19, 300, 2, 45, 46, 7, 99]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    # 2 key heads, 4 value heads; every layer a mixture of experts (no dense layer: llama.cpp's qwen3next
    # has no names for one)
    layer_types = ["linear_attention", "full_attention"] * 2
    return tiny_hf_model("qwen3_next", tied=False, layer_types=layer_types, mlp_only_layers=[])


def _converted(model, whole_qkvz: bool) -> dict[str, torch.Tensor]:
    """GGUF name -> tensor, as llama.cpp's Qwen3-Next converter writes them."""
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3NEXT, cfg.num_hidden_layers)
    out = {}
    for name, t in model.state_dict().items():
        t = t.float()
        bid = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate, up apart
            inter = cfg.moe_intermediate_size
            out[f"blk.{bid}.ffn_gate_exps.weight"] = t[:, :inter]
            out[f"blk.{bid}.ffn_up_exps.weight"] = t[:, inter:]
            continue
        if name.endswith("mlp.experts.down_proj"):
            out[f"blk.{bid}.ffn_down_exps.weight"] = t
            continue
        if name.endswith("in_proj_qkvz.weight") and not whole_qkvz:
            qkv, z = split_qkvz(t, cfg)  # (the converter's split, checked against transformers elsewhere)
            out[f"blk.{bid}.attn_qkv.weight"], out[f"blk.{bid}.attn_gate.weight"] = qkv, z
            continue
        if name.endswith("shared_expert_gate.weight"):
            t = t.squeeze(0)
        if name.endswith("A_log"):
            t = -torch.exp(t)
        elif name.endswith("dt_bias"):
            name = name.replace("dt_bias", "dt_proj.bias")
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        out[gname] = t
    return out


def write_qwen3_next_gguf(model, path, qtype=None, whole_qkvz: bool = False):
    cfg = model.config
    w = gguf_writer(path, "qwen3next", cfg, cfg.num_hidden_layers)
    add_hybrid_keys(w, cfg)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    for name, t in _converted(model, whole_qkvz).items():
        router = name.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"))
        blocks = t.dim() >= 2 and t.shape[-1] % 32 == 0 and "conv1d" not in name and not router
        if qtype is not None and blocks:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(t.numpy()), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t.numpy())
    return close_gguf(w, path)


@pytest.mark.parametrize("whole_qkvz", [False, True])
def test_tensors_come_back_as_the_checkpoint_splits_them(model, tmp_path, whole_qkvz):
    source = load_gguf(write_qwen3_next_gguf(model, tmp_path / "m.gguf", whole_qkvz=whole_qkvz))
    assert source.config.architecture == "Qwen3NextForCausalLM"
    assert source.config.layer_types == ("linear_attention", "full_attention") * 2 and INTERVAL == 2
    got = dict(source.weights())
    state = model.state_dict()
    layer = "model.layers.0.linear_attn"
    qkv, z = split_qkvz(state[f"{layer}.in_proj_qkvz.weight"], source.config)
    assert torch.equal(got[f"{layer}.in_proj_qkv.weight"], qkv) and torch.equal(
        got[f"{layer}.in_proj_z.weight"], z
    )
    ba = state[f"{layer}.in_proj_ba.weight"].reshape(2, 4, -1)  # [Hk, b b a a, H]
    assert torch.equal(got[f"{layer}.in_proj_b.weight"], ba[:, :2].reshape(4, -1))
    assert torch.equal(got[f"{layer}.in_proj_a.weight"], ba[:, 2:].reshape(4, -1))
    assert torch.allclose(got[f"{layer}.A_log"], state[f"{layer}.A_log"], atol=1e-6)
    assert not any("in_proj_qkvz" in n or "in_proj_ba" in n for n in got)


@pytest.mark.parametrize("whole_qkvz", [False, True])
def test_generates_transformers_greedy_tokens(model, tmp_path, whole_qkvz):
    path = write_qwen3_next_gguf(model, tmp_path / "m.gguf", whole_qkvz=whole_qkvz)
    want, _ = hf_greedy_reference(model, PROMPT, GREEDY.max_tokens)
    got = LLM(path, weight_quant="none").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want


def test_block_quantized_parts_stay_packed_and_are_counted(model, tmp_path, kernel_backend):
    """Q8_0: ssm_ba's and ssm_in's parts are their rows of the packed blocks; the Triton path generates the
    dequantizing CPU engine's tokens, and the planner's bytes are the loader's."""
    path = write_qwen3_next_gguf(model, tmp_path / "m.gguf", qtype=Q.Q8_0, whole_qkvz=True)
    want = LLM(path, weight_quant="none").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", **ON_DEVICE)
    in_proj = llm.model.model.layers[0].linear_attn.in_proj
    assert in_proj.qweight is not None and in_proj.weight is None
    got = llm.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want.token_ids
    config, tensors = gpu_tensors(path)
    b = next(shape for name, shape, _ in tensors if name.endswith("layers.0.linear_attn.in_proj_b.weight"))
    assert b == (4, config.hidden_size)
    qweights = {id(m.qweight): m.qweight.nbytes for m in llm.model.modules() if getattr(m, "qweight", None)}
    loaded = sum(qweights.values()) + sum(p.numel() * p.element_size() for p in llm.model.parameters())
    loaded += sum(
        t.numel() * t.element_size()
        for m in llm.model.modules()
        for stack in getattr(m, "packed", {}).values()
        for t in (stack.packed, stack.scales, stack.minimums)
        if t is not None
    )
    assert loaded == sum(held_weight_bytes(tensors, config, dtype_bytes=4).values())
