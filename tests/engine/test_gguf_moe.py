"""Mixture-of-experts GGUF files (llama.cpp's `qwen3moe`, `qwen35moe`): a tiny transformers model written
as llama.cpp's converter writes it (experts stacked per projection, or gate | up fused; the shared
expert's gate a vector) loads back as the checkpoint, generates transformers' greedy tokens, keeps its
block-quantized experts packed on the Triton path, and converts to `.ninfer`."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from conftest import hf_greedy_reference, mtp_head_tensors, save_mtp_head, save_tiny, tiny_hf_model
from test_gguf_qwen35 import _as_converted, add_hybrid_keys, close_gguf, gguf_name, gguf_writer, mtp_block

from engine import LLM, SamplingParams
from engine.formats.gguf import gpu_tensors, load_gguf
from engine.layers.moe import Experts
from engine.plan.weights import held_weight_bytes
from engine.quant.convert import convert

# the Triton-forced engines: on the GPU where there is one (the interpreter runs them only on the CPU), in
# fp32 there as here, so their tokens compare with the CPU reference's
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = dict(device=DEVICE, dtype="float32")

Q = gguf.GGMLQuantizationType
PROMPT = [4, 80, 19, 300, 2, 45, 46, 7, 99]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def write_moe_gguf(
    model, path, qtype=None, fused: bool = False, mtp_head: dict | None = None, arch_name: str | None = None
):
    """A GGUF of a transformers Qwen3-MoE / Qwen3.5-MoE with llama.cpp's keys and tensors; with `qtype`,
    the matrices (expert stacks too) as its blocks, the routers F32 as llama.cpp keeps them; `mtp_head`
    (Qwen3.5-MoE's mtp.*, a mixture-of-experts layer) as the block after the text layers; `arch_name`:
    another architecture of the same tensors (Qwen3-VL-MoE's text model, qwen3vlmoe)."""
    cfg = model.config
    hybrid = cfg.model_type.startswith("qwen3_5")
    arch = gguf.MODEL_ARCH.QWEN35MOE if hybrid else gguf.MODEL_ARCH.QWEN3MOE
    bid = cfg.num_hidden_layers
    blocks = bid + (1 if mtp_head else 0)
    names = gguf.get_tensor_name_map(arch, blocks)
    # a dense layer among sparse ones (mlp_only_layers): llama.cpp's MoE maps lack its names; Qwen3's have them
    dense_names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, blocks)
    w = gguf_writer(path, arch_name or gguf.MODEL_ARCH_NAMES[arch], cfg, blocks)
    if mtp_head:
        w.add_nextn_predict_layers(1)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if hybrid:
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
        add_hybrid_keys(w, cfg)
    inter = cfg.moe_intermediate_size
    tensors = {}
    for name, t in {**model.state_dict(), **mtp_block(mtp_head or {}, bid)}.items():
        t = t.float()
        if name.endswith("mlp.experts.gate_up_proj") and not fused:  # [E, 2I, H]: gate, up apart
            base = name.removesuffix("gate_up_proj")
            tensors[base + "gate_proj.weight"], tensors[base + "up_proj.weight"] = t[:, :inter], t[:, inter:]
        elif name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            tensors[name + ".weight"] = t
        elif name.endswith("shared_expert_gate.weight"):
            tensors[name] = t.squeeze(0)  # llama.cpp's ffn_gate_inp_shexp is a vector
        else:
            tensors[name] = t
    for hf_name, t in tensors.items():
        if hybrid:
            hf_name, t = _as_converted(hf_name, t, cfg)
        name = gguf_name(names, hf_name, bid) or dense_names.get_name(
            hf_name, try_suffixes=(".weight", ".bias")
        )
        if hf_name.endswith("mlp.experts.gate_up_proj.weight"):  # (not in every arch's map)
            name = f"blk.{hf_name.split('.')[2]}.ffn_gate_up_exps.weight"
        assert name is not None, hf_name
        router = hf_name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
        blocks = t.shape[-1] % 32 == 0  # (else F32, as llama.cpp falls back for rows not whole blocks)
        if qtype is not None and t.dim() >= 2 and blocks and "conv1d" not in hf_name and not router:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(t.numpy()), qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t.numpy())
    return close_gguf(w, path)


@pytest.fixture(scope="module")
def qwen3_moe():
    return tiny_hf_model("qwen3_moe", tied=False)  # layers: sparse, dense (mlp_only_layers), sparse


@pytest.fixture(scope="module")
def qwen35_moe():
    return tiny_hf_model("qwen3_5_moe", tied=False, layer_types=["linear_attention", "full_attention"] * 2)


def test_config_read_from_the_expert_keys(qwen3_moe, tmp_path):
    config = load_gguf(write_moe_gguf(qwen3_moe, tmp_path / "m.gguf")).config
    assert config.architecture == "Qwen3MoeForCausalLM"
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (8, 2, 32)
    assert config.mlp_only_layers == (1,) and config.norm_topk_prob
    assert [config.is_sparse_layer(i) for i in range(3)] == [True, False, True]


@pytest.mark.parametrize("fused", [False, True])
def test_experts_come_back_as_the_checkpoint_holds_them(qwen3_moe, tmp_path, fused):
    got = dict(load_gguf(write_moe_gguf(qwen3_moe, tmp_path / "m.gguf", fused=fused)).weights())
    state = qwen3_moe.state_dict()
    gate_up, down = (
        state["model.layers.2.mlp.experts.gate_up_proj"],
        state["model.layers.2.mlp.experts.down_proj"],
    )
    for e in range(8):
        base = f"model.layers.2.mlp.experts.{e}"
        assert torch.equal(got[f"{base}.gate_proj.weight"], gate_up[e, :32])
        assert torch.equal(got[f"{base}.up_proj.weight"], gate_up[e, 32:])
        assert torch.equal(got[f"{base}.down_proj.weight"], down[e])
    assert torch.equal(got["model.layers.0.mlp.gate.weight"], state["model.layers.0.mlp.gate.weight"])
    assert torch.equal(
        got["model.layers.1.mlp.down_proj.weight"], state["model.layers.1.mlp.down_proj.weight"]
    )


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe", "qwen3vlmoe"])
def test_generates_transformers_greedy_tokens(arch, qwen3_moe, qwen35_moe, tmp_path):
    """qwen3vlmoe: Qwen3-VL-MoE's text model, stored as qwen3moe's tensors, read as Qwen3-MoE."""
    model = qwen35_moe if arch == "qwen3_5_moe" else qwen3_moe
    path = write_moe_gguf(
        model, tmp_path / "m.gguf", arch_name="qwen3vlmoe" if arch == "qwen3vlmoe" else None
    )
    want, _ = hf_greedy_reference(model, PROMPT, GREEDY.max_tokens)
    got = LLM(path, weight_quant="none").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want


@pytest.mark.parametrize(
    "arch, qtype", [("qwen3_moe", Q.Q8_0), ("qwen3_moe", Q.Q4_1), ("qwen3_5_moe", Q.Q8_0)]
)
def test_block_quantized_experts_stay_packed(arch, qtype, qwen3_moe, qwen35_moe, tmp_path, kernel_backend):
    """Q8_0 / Q4_1 experts: the Triton path keeps each layer's stacks packed (the grouped MoE kernel
    multiplies them as stored) and generates the dequantizing CPU engine's tokens; the planner's bytes are
    the loader's."""
    model = qwen3_moe if arch == "qwen3_moe" else qwen35_moe
    path = write_moe_gguf(model, tmp_path / "m.gguf", qtype=qtype, fused=arch == "qwen3_moe")
    want = LLM(path, weight_quant="none").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", **ON_DEVICE)  # (the CPU would re-quantize what stays dense)
    experts = [m for m in llm.model.modules() if isinstance(m, Experts)]
    assert experts and all(set(m.packed) == {"gate_up_proj", "down_proj"} for m in experts)
    router = llm.model.model.layers[0].mlp.gate
    assert router.qweight is None and router.weight is not None  # F32 in the file, kept so
    got = llm.generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want.token_ids
    config, tensors = gpu_tensors(path)
    assert sum(".experts." in name for name, *_ in tensors) == 3 * 8 * len(experts)
    qweights = {id(m.qweight): m.qweight.nbytes for m in llm.model.modules() if getattr(m, "qweight", None)}
    held = sum(qweights.values()) + sum(p.numel() * p.element_size() for p in llm.model.parameters())
    held += sum(
        t.numel() * t.element_size()
        for m in experts
        for stack in m.packed.values()
        for t in (stack.packed, stack.scales, stack.minimums)
        if t is not None
    )
    assert held == sum(held_weight_bytes(tensors, config, dtype_bytes=4).values())


def test_convert_reads_a_moe_gguf(qwen3_moe, tmp_path):
    path = write_moe_gguf(qwen3_moe, tmp_path / "m.gguf")
    out = tmp_path / "m.ninfer"
    convert(path, out, "bf16")
    want = LLM(path, dtype="bfloat16").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    got = LLM(out, dtype="bfloat16").generate(prompt_token_ids=PROMPT, sampling_params=GREEDY)[0]
    assert got.token_ids == want.token_ids


def test_moe_mtp_head_of_a_gguf_drafts_as_the_checkpoints(qwen35_moe, tmp_path):
    """Qwen3.5-MoE's MTP block (its layer a mixture of experts, stacked in the file) drafts the tokens the
    HF checkpoint's mtp.* head drafts."""
    head = mtp_head_tensors(qwen35_moe)
    gguf_path = write_moe_gguf(qwen35_moe, tmp_path / "m.gguf", mtp_head=head)
    hf_dir = save_mtp_head(save_tiny(qwen35_moe, tmp_path / "hf"), head)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = [
        LLM(p, spec="mtp", draft_tokens=3, weight_quant="none").generate(
            prompt_token_ids=PROMPT, sampling_params=params
        )[0]
        for p in (hf_dir, gguf_path)
    ]
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].num_draft_tokens == outs[1].num_draft_tokens > 0
    assert outs[0].num_accepted_tokens == outs[1].num_accepted_tokens
