"""--weight-quant int8 / int4 where the fused kernels run (engine/quant/on_load.py): a 16-bit checkpoint's
matrices quantized as they load into packed groups of 128, exactly as `ninfer convert --recipe w8g128 /
w4g128 --method rtn` stores them. Through the Triton kernels: compiled on a GPU, interpreted on the CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model, tiny_vl_model
from test_awq_gptq import save_int4
from test_hf_quant import save_fp8_blocks

from engine import LLM
from engine.api.ollama import _quantization
from engine.errors import NinferError
from engine.quant import on_load
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert
from engine.quant.layer import GroupwiseWeight, packed_weights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = [5, 9, 200, 31, 77, 5, 9, 300, 12]
OPTIONS = dict(device=DEVICE, dtype="float32")


@pytest.mark.parametrize("mode, recipe", [("int4", "w4g128"), ("int8", "w8g128")])
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "qwen3_5"])
def test_held_as_the_recipe_converts_them(tmp_path, kernel_backend, monkeypatch, arch, mode, recipe):
    """Every matrix packed (the experts stacked packed), the embedding table too; the log-probs those of
    the converted artifact's, exactly. A slice of rows at a time (here rows of a few KB) changes nothing:
    groups run along a row."""
    model = tiny_hf_model(arch, tied=False, seed=3)
    src = save_tiny(model, tmp_path / "src")
    out = tmp_path / f"{recipe}.ninfer"
    convert(src, out, recipe, method="rtn")
    kernel_backend("triton")
    monkeypatch.setattr(on_load, "SLICE_BYTES", 4096)
    llm = LLM(src, weight_quant=mode, **OPTIONS)
    assert llm.description.endswith(f"quantized at load to {mode[3:]}-bit groups of 128")
    assert _quantization(llm) == recipe.upper()  # Ollama's quantization_level: as held
    layer = llm.model.model.layers[0]
    assert isinstance(llm.model.model.embed_tokens.qweight, GroupwiseWeight)
    assert all(w.bits == int(mode[3:]) for w in packed_weights(llm.model))
    if arch == "qwen3_moe":
        assert layer.mlp.experts.packed.keys() == {"gate_up_proj", "down_proj"}
    want = sequence_logprobs(LLM(out, weight_quant="none", **OPTIONS), PROMPT)
    assert torch.equal(sequence_logprobs(llm, PROMPT), want)


def test_stacked_experts_and_fp8_checkpoints(tmp_path, kernel_backend):
    """Qwen3-VL-MoE's stacked experts are quantized expert by expert (held packed); an FP8 checkpoint is
    quantized from the weights its codes stand for: int8 from FP8 holds half its bf16 bytes."""
    kernel_backend("triton")
    vl = tiny_vl_model(arch="qwen3_vl_moe")
    vl_dir = tmp_path / "vl"
    vl.save_pretrained(vl_dir)
    llm = LLM(vl_dir, weight_quant="int4", **OPTIONS)
    assert llm.model.model.layers[0].mlp.experts.packed["gate_up_proj"].bits == 4
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_fp8_blocks(model, tmp_path / "fp8")
    held = save_tiny(model, tmp_path / "held")  # the weights the codes stand for, stored plainly
    got = [sequence_logprobs(LLM(p, weight_quant="int8", **OPTIONS), PROMPT) for p in (path, held)]
    assert torch.equal(got[0], got[1])


def test_a_quantized_checkpoint_is_refused_and_the_cpu_keeps_its_kernels(tmp_path, kernel_backend):
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    awq = save_int4(model, tmp_path / "awq", "awq")
    kernel_backend("triton")
    with pytest.raises(
        NinferError,
        match="--weight-quant int4 quantizes a 16-bit checkpoint as it loads, "
        "but .* is quantized already .*; drop --weight-quant",
    ):
        LLM(awq, weight_quant="int4", **OPTIONS)
    kernel_backend("naive")  # the CPU's own int4 kernels, as ever
    from engine.quant.cpu import CpuInt4Weight

    llm = LLM(save_tiny(model, tmp_path / "src"), weight_quant="int4")
    assert isinstance(llm.model.model.layers[0].mlp.down_proj.qweight, CpuInt4Weight)
