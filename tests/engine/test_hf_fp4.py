"""NVFP4 HF checkpoints (engine/formats/hf_fp4.py), written here as llm-compressor and NVIDIA's Model
Optimizer store them, from e2m1 codes and scales chosen so that every weight they stand for is exact: read
as those weights (transformers on them gives the same log-probs), held at 8 bits under weight_quant auto."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_logprobs, hold_weights, save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.errors import NinferError
from engine.plan.model import resolve
from engine.quant.calibration import sequence_logprobs
from engine.quant.cpu import CpuInt8Weight

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


def _nvfp4(w: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed uint8 [N, K / 2], e4m3 scales [N, K / 16], the weights they stand for before the global
    scale): random codes, each group's scale a power of two near the group's size in w."""
    n, k = w.shape
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8)
    values = E2M1[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    group = w.abs().reshape(n, k // 16, 16).amax(-1).clamp(min=1e-6) / 6
    scale = torch.exp2(torch.round(torch.log2(group))).to(torch.float8_e4m3fn)  # exact in e4m3
    held = values * scale.float().repeat_interleave(16, dim=1)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, held


def save_nvfp4(model, path, tool: str):
    """`model` saved as `tool` ("compressed-tensors" / "modelopt") stores NVFP4; its matrices become the
    weights the codes stand for."""
    save_tiny(model, path)
    tensors, out, held = load_file(path / "model.safetensors"), {}, {}
    generator = torch.Generator().manual_seed(5)
    for name, w in tensors.items():
        if not (name.endswith("proj.weight") and w.dim() == 2 and w.shape[1] % 16 == 0):
            out[name] = w
            continue
        layer = name[: -len(".weight")]
        packed, scale, held_before = _nvfp4(w, generator)
        out[f"{layer}.weight_scale"] = scale
        if tool == "compressed-tensors":  # the global scale divides
            out[f"{layer}.weight_packed"], out[f"{layer}.weight_global_scale"] = packed, torch.tensor([4.0])
            held[name] = held_before / 4
        else:  # the second scale multiplies
            out[f"{layer}.weight"], out[f"{layer}.weight_scale_2"] = packed, torch.tensor(0.25)
            held[name] = held_before * 0.25
        out[f"{layer}.input_scale"] = torch.tensor(1.0)
    save_file(out, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    quant = CT_CONFIG if tool == "compressed-tensors" else MODELOPT_CONFIG
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    hold_weights(model, held)
    return path


@pytest.mark.parametrize("tool", ["compressed-tensors", "modelopt"])
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_read_as_the_weights_they_stand_for(tmp_path, tool, arch):
    model = tiny_hf_model(arch, tied=False, seed=3)
    path = save_nvfp4(model, tmp_path / "m", tool)
    llm = LLM(path, weight_quant="none")
    assert llm.description.endswith(", NVFP4")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    # no FP4 weight kernel: held as 8-bit groups on a GPU, the CPU's int8 kernels here (auto)
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.recipe == "NVFP4 held as 8-bit groups of 128, quantized as it loads"
    auto = LLM(path)
    assert isinstance(auto.model.model.layers[0].self_attn.o_proj.qweight, CpuInt8Weight)


def test_what_is_missing_or_not_read_is_named(tmp_path):
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_nvfp4(model, tmp_path / "m", "modelopt")
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


def save_mxfp4(model, path):
    """`model` saved as llm-compressor stores MXFP4 (e2m1 codes, an e8m0 exponent a group of 32); its
    matrices become the weights the codes stand for."""
    save_tiny(model, path)
    tensors, out, held = load_file(path / "model.safetensors"), {}, {}
    generator = torch.Generator().manual_seed(6)
    for name, w in tensors.items():
        if not (name.endswith("proj.weight") and w.dim() == 2 and w.shape[1] % 32 == 0):
            out[name] = w
            continue
        layer = name[: -len(".weight")]
        n, k = w.shape
        codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.uint8)
        values = E2M1[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
        group = w.abs().reshape(n, k // 32, 32).amax(-1).clamp(min=1e-6) / 6
        exponent = torch.round(torch.log2(group)).clamp(-127, 127)
        out[f"{layer}.weight_packed"] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        out[f"{layer}.weight_scale"] = (exponent + 127).to(torch.uint8)
        held[name] = values * torch.exp2(exponent).repeat_interleave(32, dim=1)
    save_file(out, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": MX_CONFIG}))
    hold_weights(model, held)
    return path


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_mxfp4_reads_as_the_weights_it_stands_for(tmp_path, arch):
    model = tiny_hf_model(arch, tied=False, seed=4)
    path = save_mxfp4(model, tmp_path / "m")
    llm = LLM(path, weight_quant="none")
    assert llm.description.endswith(", MXFP4")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.recipe == "MXFP4 held as 8-bit groups of 128, quantized as it loads"
    auto = LLM(path)
    assert isinstance(auto.model.model.layers[0].self_attn.o_proj.qweight, CpuInt8Weight)


def test_mxfp4_damage_and_other_layouts_are_named(tmp_path):
    model = tiny_hf_model("qwen3", tied=False, seed=4)
    path = save_mxfp4(model, tmp_path / "m")
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
