"""HF checkpoints another tool quantized (engine/formats/hf_quant.py): FP8 ones (Qwen's -FP8 releases in
128 x 128 blocks with `weight_scale_inv`; llm-compressor's float8 with `weight_scale`) and llm-compressor's
int8 load dequantized and match transformers run on the same dequantized weights; other methods are refused
in a sentence."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import hf_logprobs, hold_weights, save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.errors import NinferError
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

PROMPT = [5, 9, 200, 31, 77, 5, 9, 300, 12]
FP8_METHOD = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}


def _quantized(name: str) -> bool:
    """Attention and MLP matrices (each expert's), Qwen3-Next's fused linear-attention projections; not the
    router."""
    return name.endswith(("proj.weight", "in_proj_qkvz.weight", "in_proj_ba.weight"))


def fp8_blocks(w: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scale per block, the weights they stand for) of w [N, K], block by block."""
    n, k = w.shape
    scale = torch.empty(-(-n // rows), -(-k // cols))
    codes = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = w[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]
            scale[i, j] = block.abs().max().clamp(min=1e-12) / 448
            codes[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols] = (block / scale[i, j]).to(
                codes.dtype
            )
    held = torch.empty_like(w)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            part = codes[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols].float() * scale[i, j]
            held[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols] = part.to(torch.bfloat16).float()
    return codes, scale, held


def fp8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scale per output row [N, 1], the weights they stand for)."""
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448
    codes = (w / scale).to(torch.float8_e4m3fn)
    return codes, scale, (codes.float() * scale).to(torch.bfloat16).float()


def save_fp8(model, path, quantization: dict, quantize, scale_name: str, split: bool = False, extra=None):
    """`model` saved, then its matrices rewritten as FP8 codes with `scale_name` tensors beside them; the
    model's own matrices become the weights the codes stand for (the reference). `split`: the scales in a
    second shard, named in an index."""
    save_tiny(model, path)
    tensors = load_file(path / "model.safetensors")
    codes, scales, held = {}, {}, {}
    for name, w in tensors.items():
        if _quantized(name):
            codes[name], scales[name + scale_name], held[name] = quantize(w)
        else:
            codes[name] = w
    scales.update(extra or {})
    (path / "model.safetensors").unlink()
    if split:
        first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
        save_file(codes, path / first)
        save_file(scales, path / second)
        weight_map = {**dict.fromkeys(codes, first), **dict.fromkeys(scales, second)}
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        save_file({**codes, **scales}, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    hold_weights(model, held)
    return path


def save_fp8_blocks(model, path):
    """`model` saved as a Qwen `-FP8` release stores it: 128 x 128 blocks, a `weight_scale_inv` each."""
    quantization = {**FP8_METHOD, "weight_block_size": [128, 128]}
    return save_fp8(model, path, quantization, lambda w: fp8_blocks(w, 128, 128), "_scale_inv")


@pytest.mark.parametrize(
    "arch, split, block",
    [
        ("qwen3", False, (24, 40)),
        ("qwen3", True, (24, 40)),
        ("qwen3", False, (16, 32)),
        ("qwen3_moe", False, (24, 40)),
        ("qwen3_moe", True, (16, 32)),
        ("qwen3_next", False, (24, 40)),  # its fused projections dequantized, then split
    ],
)
def test_fp8_blocks_load_as_the_weights_they_stand_for(tmp_path, arch, split, block):
    """Blocks of 24 x 40 (rows and columns not multiples of them) or 16 x 32 (whole blocks), scales in the
    weights' shard or in another: the engine's logprobs are transformers' on the dequantized weights."""
    model = tiny_hf_model(arch, tied=False, seed=3)
    quantization = {**FP8_METHOD, "weight_block_size": list(block)}
    path = save_fp8(
        model, tmp_path / arch, quantization, lambda w: fp8_blocks(w, *block), "_scale_inv", split
    )
    llm = LLM(path, weight_quant="none")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_compressed_tensors_int8_per_tensor(tmp_path):
    """llm-compressor's int8 with one scale a tensor (`int-quantized`, strategy tensor) loads as the weights
    it stands for, dequantized (where the fused kernels run, 8-bit groups of 128 quantized as it loads; a
    scale a row or a group is read as 8-bit groups as stored: engine/formats/hf_intq.py)."""
    from engine.plan.model import resolve

    model = tiny_hf_model("qwen3", tied=False, seed=4)
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor"}
    quantization = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }

    def per_tensor(w):
        scale = w.abs().max() / 127
        codes = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
        return codes, scale.reshape(1), (codes.float() * scale).to(torch.bfloat16).float()

    path = save_fp8(model, tmp_path / "w8a8", quantization, per_tensor, "_scale")
    llm = LLM(path, weight_quant="none")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.recipe == "INT8 held as 8-bit groups of 128, quantized as it loads"


def test_compressed_tensors_float8_per_row(tmp_path):
    """llm-compressor's FP8: a `weight_scale` per output row; the activations' `input_scale`s are not
    needed (activations stay 16-bit) and are passed over."""
    model = tiny_hf_model("qwen3", tied=False, seed=4)
    quantization = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            }
        },
        "ignore": ["lm_head"],
    }
    extra = {"model.layers.0.self_attn.q_proj.input_scale": torch.tensor([0.5])}
    path = save_fp8(model, tmp_path / "ct", quantization, fp8_rows, "_scale", extra=extra)
    llm = LLM(path, weight_quant="none")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_an_fp8_checkpoint_converts(tmp_path):
    """`ninfer convert` reads the FP8 checkpoint as the bf16 one it stands for: converted, it is what that
    checkpoint converts to, recipe by recipe."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp8_blocks(model, tmp_path / "fp8")
    held = save_tiny(model, tmp_path / "held")  # the weights the codes stand for, as a plain checkpoint
    for recipe in ("bf16", "w8g128"):
        logprobs = []
        for source in (path, held):
            out = tmp_path / f"{source.name}-{recipe}.ninfer"
            convert(source, out, recipe, method="rtn")
            logprobs.append(sequence_logprobs(LLM(out, weight_quant="none"), PROMPT))
        assert torch.equal(logprobs[0], logprobs[1]), recipe


def test_a_missing_or_misshapen_scale_is_named(tmp_path):
    model = tiny_hf_model("qwen3", tied=False)
    quantization = {**FP8_METHOD, "weight_block_size": [24, 40]}
    path = save_fp8(model, tmp_path / "m", quantization, lambda w: fp8_blocks(w, 24, 40), "_scale_inv")
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name + "_scale_inv"}, path / "model.safetensors")
    with pytest.raises(NinferError, match=f"{name} is FP8 but the checkpoint has no {name}_scale_inv"):
        LLM(path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [32, 32]
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        NinferError, match=r"its scale is \(3, 4\), but 32 x 32 blocks of a \(64, 128\) matrix need \(2, 4\)"
    ):
        LLM(path)


@pytest.mark.parametrize(
    "quantization, named",
    [
        ({"quant_method": "hqq", "nbits": 4}, "hqq"),
        ({"quant_method": "quanto", "weights": "int4"}, "quanto"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
        (
            {"quant_method": "compressed-tensors", "format": "pack-quantized"},
            "compressed-tensors pack-quantized",
        ),
        (  # int8 with zero points
            {
                "quant_method": "compressed-tensors",
                "format": "int-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int", "symmetric": False}}},
            },
            "compressed-tensors int-quantized",
        ),
    ],
)
def test_other_quantizations_are_refused_before_loading(tmp_path, quantization, named):
    path = save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path / "q")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    message = f"was quantized by another tool (quantization_config: {named}), which ninfer does not read"
    with pytest.raises(NinferError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LLM(path)
    for command in (["plan", str(path), "--vram", "24G"], ["serve", str(path)]):
        done = subprocess.run(
            [sys.executable, "-m", "ninfer_cli.main", *command], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert named in done.stderr and "ninfer convert" in done.stderr


def test_plan_counts_an_fp8_checkpoint_at_the_8_bits_it_loads_as(tmp_path):
    """Where the fused kernels run, an FP8 checkpoint's matrices are quantized as they load into 8-bit groups
    (weight_quant auto): `plan` counts them as the plain checkpoint at w8g128; planned at bf16, its serve
    line keeps them so (--weight-quant none)."""
    from engine.plan.model import resolve

    model = tiny_hf_model("qwen3", tied=False, seed=3)
    plain = save_tiny(model, tmp_path / "plain")
    fp8 = save_fp8_blocks(model, tmp_path / "fp8")
    planned = resolve(str(fp8), None, None, None, False, False)
    w8 = resolve(str(plain), None, "w8g128", None, False, False)
    assert planned.weights == w8.weights and planned.packed_weights
    assert planned.recipe == "FP8 held as 8-bit groups of 128, quantized as it loads"
    assert resolve(str(fp8), None, "bf16", None, False, False).serve_flags == " --weight-quant none"


def test_fp8_held_at_8_bits_where_the_kernels_run(tmp_path, kernel_backend):
    """weight_quant auto holds an FP8 checkpoint's matrices as 8-bit groups of 128 (quantized as they load
    from the weights the codes stand for): what the plain checkpoint converts to at w8g128 (rtn), exactly;
    none keeps them 16-bit; the CPU's own path is unchanged."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    fp8 = save_fp8_blocks(model, tmp_path / "fp8")
    w8 = tmp_path / "w8.ninfer"
    convert(save_tiny(model, tmp_path / "plain"), w8, "w8g128", method="rtn")
    kernel_backend("triton")
    options = dict(device=DEVICE, dtype="float32")
    auto = LLM(fp8, **options)
    assert auto.description.endswith(", FP8, quantized at load to 8-bit groups of 128")
    assert auto.model.model.layers[0].mlp.down_proj.qweight.bits == 8
    want = sequence_logprobs(LLM(w8, weight_quant="none", **options), PROMPT)
    assert torch.equal(sequence_logprobs(auto, PROMPT), want)
    dense = LLM(fp8, weight_quant="none", **options)
    assert dense.model.model.layers[0].mlp.down_proj.qweight is None
    kernel_backend("naive")  # the CPU: its int8 kernels, as for an 8-bit checkpoint
    from engine.quant.cpu import CpuInt8Weight

    cpu = LLM(fp8)
    assert isinstance(cpu.model.model.layers[0].mlp.down_proj.qweight, CpuInt8Weight)
    plain = LLM(tmp_path / "plain", weight_quant="int8")  # the same weights, stored plainly
    assert torch.equal(sequence_logprobs(cpu, PROMPT), sequence_logprobs(plain, PROMPT))


def test_model_optimizer_fp8_reads_as_fp8(tmp_path):
    """NVIDIA Model Optimizer's FP8 (`quant_algo: FP8`): e4m3 codes and one `weight_scale` a tensor that
    multiplies."""

    def per_tensor(w):
        scale = w.abs().max().clamp(min=1e-12) / 448
        codes = (w / scale).to(torch.float8_e4m3fn)
        return codes, scale.reshape(()), (codes.float() * scale).to(torch.bfloat16).float()

    model = tiny_hf_model("qwen3", tied=False, seed=3)
    quantization = {"quant_method": "modelopt", "quant_algo": "FP8"}
    path = save_fp8(model, tmp_path / "m", quantization, per_tensor, "_scale")
    llm = LLM(path, weight_quant="none")
    assert llm.description.endswith(", FP8")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
