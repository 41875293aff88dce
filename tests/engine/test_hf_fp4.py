"""NVFP4 HF checkpoints (engine/formats/hf_fp4.py), written here as llm-compressor and NVIDIA's Model
Optimizer store them, from e2m1 codes and scales chosen so that every weight they stand for is exact: read
as those weights (transformers on them gives the same log-probs); where the fused kernels run, held as stored
under weight_quant auto (kernels/fp4_matmul; a mixture of experts' matrices through kernels/fused_moe)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_logprobs, hold_weights, save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.bench.roofline import cost_of_llm
from engine.errors import NinferError
from engine.plan.model import resolve
from engine.quant.calibration import sequence_logprobs
from engine.quant.cpu import CpuInt8Weight
from engine.quant.fp4_layer import DenseRows, Fp4Weight
from ninfer_kernels.fp4_matmul import naive
from ninfer_kernels.fused_moe.naive import Fp4Experts

PROMPT = [5, 9, 200, 31, 77, 5, 9, 300, 12]
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
CT_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}
    },
}
MODELOPT_CONFIG = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
MX_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "float",
                "strategy": "group",
                "group_size": 32,
                "symmetric": True,
            },
        }
    },
}


def _fp4_codes(w: torch.Tensor, group: int, generator: torch.Generator):
    """(packed uint8 [N, K / 2], each group's exponent [N, K / group], the e2m1 values [N, K]): random codes,
    each group's scale the power of two nearest the group's size in w."""
    n, k = w.shape
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8)
    values = E2M1[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    size = w.abs().reshape(n, k // group, group).amax(-1).clamp(min=1e-6) / 6
    return codes[:, 0::2] | (codes[:, 1::2] << 4), torch.round(torch.log2(size)), values


def save_fp4(model, path, tool: str):
    """`model` saved as `tool` stores it: "compressed-tensors" / "modelopt" NVFP4, "mxfp4" llm-compressor's
    MXFP4; its matrices become the weights the codes stand for."""
    save_tiny(model, path)
    group = 32 if tool == "mxfp4" else 16
    tensors, out, held = load_file(path / "model.safetensors"), {}, {}
    generator = torch.Generator().manual_seed(5)
    for name, w in tensors.items():
        # (Qwen3-Next's fused projections; Qwen3.5's in_proj_qkv and in_proj_z, not its small b and a)
        fp4 = name.endswith(
            ("proj.weight", "proj_qkvz.weight", "proj_ba.weight", "proj_qkv.weight", "proj_z.weight")
        )
        if not (fp4 and w.dim() == 2 and w.shape[1] % group == 0):
            out[name] = w
            continue
        layer = name[: -len(".weight")]
        packed, exponent, values = _fp4_codes(w, group, generator)
        if tool == "mxfp4":  # e8m0: the exponent plus 127, no tensor scale
            held[name] = values * torch.exp2(exponent).repeat_interleave(group, dim=1)
            out[f"{layer}.weight_packed"] = packed
            out[f"{layer}.weight_scale"] = (exponent + 127).to(torch.uint8)
            continue
        scale = torch.exp2(exponent).to(torch.float8_e4m3fn)  # (a power of two: exact where e4m3 has it)
        held[name] = values * scale.float().repeat_interleave(group, dim=1)
        out[f"{layer}.weight_scale"] = scale
        if tool == "compressed-tensors":  # the global scale divides
            out[f"{layer}.weight_packed"], out[f"{layer}.weight_global_scale"] = packed, torch.tensor([4.0])
            held[name] = held[name] / 4
        else:  # the second scale multiplies
            out[f"{layer}.weight"], out[f"{layer}.weight_scale_2"] = packed, torch.tensor(0.25)
            held[name] = held[name] * 0.25
        out[f"{layer}.input_scale"] = torch.tensor(1.0)
    save_file(out, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    quant = {"compressed-tensors": CT_CONFIG, "modelopt": MODELOPT_CONFIG, "mxfp4": MX_CONFIG}[tool]
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    hold_weights(model, held)
    return path


@pytest.mark.parametrize("tool", ["compressed-tensors", "modelopt", "mxfp4"])
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_read_as_the_weights_they_stand_for(tmp_path, tool, arch):
    model = tiny_hf_model(arch, tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", tool)
    label = "MXFP4" if tool == "mxfp4" else "NVFP4"
    llm = LLM(path, weight_quant="none")
    assert llm.description.endswith(f", {label}")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    # held as stored on a GPU (experts too), the CPU's int8 kernels here (auto)
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.recipe == f"{label} as stored"
    auto = LLM(path)
    assert isinstance(auto.model.model.layers[0].self_attn.o_proj.qweight, CpuInt8Weight)


def test_what_is_missing_or_not_read_is_named(tmp_path):
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", "modelopt")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight_scale_2"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        NinferError, match=r"up_proj.weight is NVFP4 but the checkpoint has no .*weight_scale_2"
    ):
        LLM(path, weight_quant="none")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["quant_algo"] = "W4A8_AWQ"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NinferError, match="Model Optimizer as W4A8_AWQ; ninfer reads its NVFP4"):
        LLM(path)


def test_mxfp4_damage_and_other_layouts_are_named(tmp_path):
    model = tiny_hf_model("qwen3", tied=False, seed=4)
    path = save_fp4(model, tmp_path / "m", "mxfp4")
    tensors = load_file(path / "model.safetensors")
    scale = tensors["model.layers.0.mlp.down_proj.weight_scale"]
    scale[0, 0] = 255
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(NinferError, match=r"layers.0.mlp.down_proj: its MXFP4 scales hold NaN"):
        LLM(path, weight_quant="none")
    del tensors["model.layers.0.mlp.down_proj.weight_scale"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(NinferError, match=r"down_proj.weight_packed is MXFP4 but the checkpoint has no"):
        LLM(path, weight_quant="none")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        NinferError, match="is mxfp4-pack-quantized but its weights are not 4-bit floats in groups of 32"
    ):
        LLM(path)


@pytest.mark.parametrize("tool", ["compressed-tensors", "modelopt", "mxfp4"])
def test_held_as_stored_where_the_fused_kernels_run(tmp_path, kernel_backend, tool):
    """Triton forced (a GPU's path, interpreted here): every FP4 projection an Fp4Weight over the stored codes
    and scales (the fused q|k|v keeping each part's tensor scale), the matrices stored 16-bit as they are;
    the log-probs transformers' on the weights the codes stand for. `plan` counts what is held.
    --weight-quant int8 still rounds them into 8-bit groups."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", tool)
    kernel_backend("triton")
    llm = LLM(path, dtype="float32")
    attn, mlp = llm.model.model.layers[0].self_attn, llm.model.model.layers[1].mlp
    for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
        assert isinstance(proj.qweight, Fp4Weight) and proj.weight is None
        assert proj.qweight.e8m0 == (tool == "mxfp4") and proj.qweight.packed.dtype == torch.uint8
    assert llm.model.lm_head.qweight is None and llm.model.lm_head.weight is not None
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    held = sum(p.qweight.nbytes for p in _projections(llm))
    stored = load_file(path / "model.safetensors")
    codes = sum(t.numel() for n, t in stored.items() if t.dtype == torch.uint8 and not n.endswith("scale"))
    assert held == codes + _scale_bytes(stored) + _row_bytes(llm)
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.recipe == f"{'MXFP4' if tool == 'mxfp4' else 'NVFP4'} as stored"
    dense = sum(p.numel() * 4 for n, p in llm.model.named_parameters() if p is not None)
    assert sum(planned.weights.values()) == held + dense // 2  # (plan counts 16-bit weights)
    rounded = LLM(path, dtype="float32", weight_quant="int8")
    assert rounded.model.model.layers[0].self_attn.o_proj.qweight.bits == 8
    with pytest.raises(
        NinferError, match=r"int8-prefill .* NVFP4 / MXFP4 held as stored: --weight-quant int4"
    ):
        LLM(path, dtype="float32", int8_prefill=True)


def test_speculative_verification_multiplies_the_fp4_weights_as_stored(tmp_path, kernel_backend):
    """Triton forced: the model drafting for itself (every draft accepted), each step verifies 4 tokens of
    both sequences, 8 rows through fp4_matmul's tile kernel (decode alone: the M = 1 GEMV); the greedy tokens
    are those of the dequantized weights."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", "modelopt")
    prompts = [[5, 9, 200, 31, 77, 5, 9, 200, 31, 77, 5, 9], [12, 40, 12, 40, 12, 40, 12]]
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    want = LLM(path, dtype="float32", weight_quant="none").generate(
        prompt_token_ids=prompts, sampling_params=greedy
    )
    kernel_backend("triton")
    llm = LLM(path, dtype="float32", spec="draft", draft_tokens=3, draft_model=str(path))
    assert isinstance(llm.model.model.layers[0].self_attn.qkv_proj.qweight, Fp4Weight)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(o.num_accepted_tokens == o.num_draft_tokens > 0 for o in got)


def _projections(llm) -> list:
    return [m for m in llm.model.modules() if isinstance(getattr(m, "qweight", None), Fp4Weight)]


def _scale_bytes(stored: dict) -> int:
    """The group scales' bytes (e4m3 or e8m0: one a group)."""
    return sum(t.numel() for n, t in stored.items() if n.endswith(".weight_scale"))


def _row_bytes(llm) -> int:
    """The fp32 tensor scale each row of an FP4 weight keeps."""
    return sum(4 * p.qweight.out_features for p in _projections(llm))


def test_experts_are_held_as_stored_and_qwen3_next_splits_its_fused_projections(tmp_path, kernel_backend):
    """A mixture of experts' FP4 matrices stacked as stored (Fp4Experts: the fused MoE kernel decodes them),
    its attention an Fp4Weight; `plan` counts what is held. Qwen3-Next's fused in_proj_qkvz / in_proj_ba
    split into Qwen3.5's parts row by row, codes, scales and tensor scales alike. Log-probs transformers'."""
    kernel_backend("triton")
    moe = tiny_hf_model("qwen3_moe", tied=False, seed=3)
    path = save_fp4(moe, tmp_path / "moe", "compressed-tensors")
    llm = LLM(path, dtype="float32")
    layer = llm.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj.qweight, Fp4Weight)
    stacks = layer.mlp.experts.packed
    assert isinstance(stacks["gate_up_proj"], Fp4Experts) and isinstance(stacks["down_proj"], Fp4Experts)
    assert layer.mlp.experts.gate_up_proj is None
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(moe, PROMPT)).abs().max() < 1e-4
    sparse = [m.mlp.experts for m in llm.model.model.layers if hasattr(m.mlp, "experts")]
    experts = sum(s.nbytes for e in sparse for s in e.packed.values())
    assert experts == sum(t.nbytes for e in sparse for s in e.packed.values() for t in s[:3])
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.weights["experts"] == experts
    mlps = [m.mlp for m in llm.model.model.layers]
    held = sum(
        q.qweight.nbytes
        for m in mlps
        for q in m.modules()
        if isinstance(q.qweight if hasattr(q, "qweight") else None, Fp4Weight)
    )
    held += sum(p.numel() * 2 for m in mlps for p in m.parameters())  # routers, 16-bit (plan's count)
    assert planned.recipe == "NVFP4 as stored" and held == planned.weights["mlp"]
    # bench's roofline: a decode step of one token reads top_k of each layer's experts
    cost = cost_of_llm(llm)
    assert cost.expert_bytes == experts
    cfg = llm.model_config
    share = cfg.num_experts_per_tok / cfg.num_experts
    assert cost.decode_bytes(0) == pytest.approx(cost.weight_bytes + experts * share)
    nxt = tiny_hf_model("qwen3_next", tied=False, seed=3)
    path = save_fp4(nxt, tmp_path / "next", "modelopt")
    llm = LLM(path, dtype="float32")
    proj = llm.model.model.layers[0].linear_attn.in_proj
    assert isinstance(proj.qweight, Fp4Weight) and proj.weight is None
    w = proj.qweight
    held = naive.dequantize_weight(w.packed, w.scale_codes, w.multiplier, w.group_size, w.e8m0, w.k)
    dense = LLM(path, dtype="float32", weight_quant="none").model.model.layers[0].linear_attn.in_proj.weight
    assert torch.equal(held, dense)  # each row where Qwen3.5's layout holds it, exactly
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(nxt, PROMPT)).abs().max() < 1e-3


def test_a_fused_projection_of_fp4_and_16_bit_shards_keeps_both(tmp_path, kernel_backend):
    """Qwen3.5's in_proj fuses in_proj_qkv / in_proj_z (FP4 here) with in_proj_b / in_proj_a (kept 16-bit):
    held as one Fp4Weight and the 16-bit rows beside it (DenseRows), each writing its columns of one
    output; the log-probs transformers'. A 16-bit shard the checkpoint lacks is named."""
    model = tiny_hf_model("qwen3_5", tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", "compressed-tensors")
    kernel_backend("triton")
    llm = LLM(path, dtype="float32")
    proj = llm.model.model.layers[0].linear_attn.in_proj
    assert proj.weight is None and [type(p) for p in proj.qweight.parts] == [Fp4Weight, DenseRows]
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.0.linear_attn.in_proj_a.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(NinferError, match=r"layers.0.linear_attn.in_proj.weight \[a\] is missing; download"):
        LLM(path, dtype="float32")


def test_damaged_scales_are_named_before_they_are_held(tmp_path, kernel_backend):
    """An NVFP4 scale of NaN (e4m3's 0x7F), or stored as another dtype, refused in one line naming the layer."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", "compressed-tensors")
    kernel_backend("triton")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.1.self_attn.o_proj.weight_scale"
    scale = tensors[name].view(torch.uint8).clone()
    scale[0, 0] = 0x7F
    save_file({**tensors, name: scale.view(torch.float8_e4m3fn)}, path / "model.safetensors")
    with pytest.raises(NinferError, match=r"layers.1.self_attn.o_proj: its NVFP4 scales hold NaN"):
        LLM(path, dtype="float32")
    save_file({**tensors, name: tensors[name].float()}, path / "model.safetensors")
    with pytest.raises(
        NinferError, match=r"o_proj: its NVFP4 scale is torch.float32, not e4m3; load it with"
    ):
        LLM(path, dtype="float32")


def test_each_parameter_is_placed_once_its_shards_have_streamed(tmp_path, kernel_backend, monkeypatch):
    """The loader places a parameter as soon as the stream has given all its shards (q, k, v: then the fused
    weight), not after the whole checkpoint: its quantized matrices are copies, and a 27B NVFP4 checkpoint's
    would otherwise sit in host memory at once (15 GB)."""
    from engine.formats import hf_fp4

    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp4(model, tmp_path / "m", "modelopt")
    kernel_backend("triton")
    streamed, placed = [0], []
    real_native, real_from_shards = hf_fp4.native_weights, Fp4Weight.from_shards

    def counting(*args):
        quantized, unquantized = real_native(*args)

        def counted():
            for item in quantized():
                streamed[0] += 1
                yield item

        return counted, unquantized

    def placing(shards, device):
        placed.append(streamed[0])
        return real_from_shards(shards, device)

    monkeypatch.setattr(hf_fp4, "native_weights", counting)
    monkeypatch.setattr(Fp4Weight, "from_shards", staticmethod(placing))
    llm = LLM(path, dtype="float32")
    # 14 matrices, 8 parameters (qkv, o, gate_up, down a layer), each placed once its last shard streamed
    assert streamed[0] == 14 and len(placed) == 8 and placed == sorted(placed) and placed[0] <= 3
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_plan_of_a_config_alone_counts_fp4_matrices_as_the_tools_store_them(tmp_path):
    """An NVFP4 config.json with no weights beside it (a download not made yet): `plan` estimates its
    matrices FP4 as held and the head and embeddings 16-bit, as llm-compressor and Model Optimizer keep
    them: what the same shapes as dummy:...:nvfp4 count."""
    config = tiny_hf_model("qwen3", tied=False, seed=3).config.to_dict()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(config))
    quantized = tmp_path / "nvfp4"
    quantized.mkdir()
    (quantized / "config.json").write_text(json.dumps({**config, "quantization_config": MODELOPT_CONFIG}))
    planned = resolve(str(quantized), None, None, None, False, False)
    assert planned.recipe == "NVFP4 (estimated from config.json)"
    assert planned.weights == resolve(f"dummy:{plain}:nvfp4", None, None, None, False, False).weights
