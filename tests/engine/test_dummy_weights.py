"""`dummy:SHAPE[:RECIPE]`: random weights at a preset's or a config's shapes (engine/formats/dummy.py)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_hf_model
from typer.testing import CliRunner

from engine import LLM, SamplingParams
from engine.errors import NinferError
from engine.formats.dummy import byte_tokenizer, checkpoint_tensors, load_dummy, parse
from engine.plan.presets import PRESETS, preset
from engine.plan.weights import recipe_weight_bytes
from engine.quant.layer import holds_packed_weights
from ninfer_cli.main import app

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (the Triton-forced engine)


@pytest.mark.parametrize("name", [p for p in PRESETS if p != "default"])
def test_every_preset_names_its_tensors_as_a_checkpoint_would(name):
    """Each tensor is named as its checkpoint names it (checkpoint_tensors refuses a name that does not load
    back into its parameter), and the 16-bit bytes they add up to are what `ninfer plan` counts for the
    preset's text model."""
    config = preset(name).config
    tensors = checkpoint_tensors(config)
    assert len({n for n, _ in tensors}) == len(tensors)
    numel = sum(_prod(shape) for _, shape in tensors)
    planned = recipe_weight_bytes(config, "bf16", 2, None, bool(config.mtp_num_hidden_layers), False)
    assert 2 * numel == sum(planned.values())


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _tiny_config(tmp_path, arch: str, tied: bool = False):
    path = tmp_path / arch
    path.mkdir()
    (path / "config.json").write_text(json.dumps(tiny_hf_model(arch, tied=tied).config.to_dict()))
    return path


@pytest.mark.parametrize(
    "arch,recipe", [("qwen3", "w4g128"), ("qwen3", "w8g32"), ("qwen3", "bf16"), ("qwen3_5", "w6g128")]
)
def test_a_tiny_shape_loads_and_generates_the_same_tokens_each_time(tmp_path, arch, recipe):
    """A config.json's shapes with random weights load on the CPU (the quantized matrices as a quantized
    checkpoint's) and decode: the weights are seeded, so two loads give the same greedy tokens."""
    spec = f"dummy:{_tiny_config(tmp_path, arch)}:{recipe}"
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = []
    for _ in range(2):
        llm = LLM(spec, max_context=64)
        out = llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling_params=params)[0]
        runs.append(out.token_ids)
    assert len(runs[0]) == 6 and runs[0] == runs[1]
    assert isinstance(llm.generate("Hello", params)[0].text, str)  # text in and out (the byte tokenizer)
    bits = {int(recipe[1])} if recipe != "bf16" else set()
    assert set(load_dummy(spec).tensor_bits.values()) == bits


@pytest.mark.parametrize("arch,recipe", [("qwen3", "w4g128"), ("qwen3_moe", "w8g32"), ("qwen3_5", "w4g32")])
def test_packed_weights_decode_as_their_dequantized_copies(tmp_path, kernel_backend, arch, recipe):
    """The fused kernels' packed copies (Triton forced: interpreted here) and the naive path's dequantized
    ones are the same random matrices: the same greedy tokens."""
    spec = f"dummy:{_tiny_config(tmp_path, arch)}:{recipe}"
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    kernel_backend("naive")
    dense = LLM(spec, weight_quant="none", max_context=64)
    assert not holds_packed_weights(dense.model)
    kernel_backend("triton")
    packed = LLM(spec, weight_quant="none", max_context=64, device=DEVICE, dtype="float32")
    assert holds_packed_weights(packed.model)
    prompt = [[5, 6, 7, 8, 9]]
    want = dense.generate(prompt_token_ids=prompt, sampling_params=params)[0].token_ids
    assert packed.generate(prompt_token_ids=prompt, sampling_params=params)[0].token_ids == want


def test_a_tied_head_is_one_tensor(tmp_path):
    names = [
        n for n, _ in checkpoint_tensors(load_dummy(f"dummy:{_tiny_config(tmp_path, 'qwen3', True)}").config)
    ]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names


def test_the_byte_tokenizer_reads_text_as_bytes_and_spans_the_vocabulary():
    tok = byte_tokenizer(1000)
    text = "héllo, wörld\n"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text
    assert tok.vocab_size == 1000 and tok.eos_token_ids == (999,)
    assert tok.decode([400, 401]) == "<t400><t401>"
    chat = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert (
        tok.decode(chat, skip_special_tokens=False)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(NinferError, match="too small"):
        byte_tokenizer(100)


def test_spec_parsing(tmp_path):
    assert parse("dummy:qwen3-8b") == ("qwen3-8b", "w4g128")
    assert parse("dummy:qwen3-8b:bf16") == ("qwen3-8b", "bf16")
    folder = _tiny_config(tmp_path, "qwen3")
    assert parse(f"dummy:{folder}") == (str(folder), "w4g128")
    assert parse(f"dummy:{folder}/config.json:w8g128") == (f"{folder}/config.json", "w8g128")


@pytest.mark.parametrize(
    "spec,message",
    [
        ("dummy:", "names no shape"),
        ("dummy:qwen3-8b:w5g128", "take the recipes"),
        ("dummy:qwen3-8b:q4.6", "take the recipes"),
        ("dummy:qwen9-1b", "neither a preset"),
        ("dummy:default", "neither a preset"),
    ],
)
def test_bad_specs_say_what_to_write(spec, message):
    with pytest.raises(NinferError, match=message):
        load_dummy(spec)


def test_a_file_that_is_not_a_config_is_refused(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(NinferError, match="not an HF config.json"):
        load_dummy(f"dummy:{bad}")
    with pytest.raises(NinferError, match="neither a preset"):
        load_dummy(f"dummy:{tmp_path / 'weights.bin'}")


def test_plan_counts_a_dummy_spec_as_its_shape_and_recipe():
    """`ninfer plan dummy:SHAPE[:RECIPE]`: the preset's bytes at that recipe (groups of 32 at their bits a
    weight), and a serve line that loads the same random weights; --recipe beside it is refused."""
    from engine.plan.model import resolve

    planned = resolve("dummy:qwen3-8b", None, None, None, False, False)
    assert planned.weights == resolve(None, "qwen3-8b", "w4g128", None, False, False).weights
    assert planned.serve_arg == "dummy:qwen3-8b" and planned.packed_weights
    g32 = resolve("dummy:qwen3-8b:w4g32", None, None, None, False, False)
    assert sum(g32.weights.values()) > sum(planned.weights.values())
    result = CliRunner().invoke(app, ["plan", "dummy:qwen3.5-27b", "--vram", "24G", "--context", "32k"])
    assert result.exit_code == 0 and "ninfer serve dummy:qwen3.5-27b " in result.output
    result = CliRunner().invoke(app, ["plan", "dummy:qwen3-8b", "--vram", "24G", "--recipe", "q4.6"])
    assert result.exit_code == 2 and "drop --recipe" in result.output


@pytest.mark.skipif(
    DEVICE == "cuda", reason="interpreted kernels: on a GPU test_quant_matmul times the f16x2 GEMV"
)
def test_the_f16x2_gemvs_decode_a_batch_as_the_default_ones(tmp_path, kernel_backend, monkeypatch):
    """GEMV_HALF2 on (gemv4h.py for 16-bit activations: one sequence's decode at M = 1, two at M = 2)
    gives a bf16 engine the greedy tokens of the default GEMVs (Triton forced, interpreted)."""
    from ninfer_kernels.quant_matmul import triton as fused

    spec = f"dummy:{_tiny_config(tmp_path, 'qwen3')}:w4g128"
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    kernel_backend("triton")
    runs = []
    for half2 in (False, True):
        monkeypatch.setattr(fused, "GEMV_HALF2", half2)
        llm = LLM(spec, weight_quant="none", max_context=64, device=DEVICE, dtype="bfloat16")
        assert holds_packed_weights(llm.model)
        one = llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling_params=params)[0].token_ids
        two = [
            o.token_ids
            for o in llm.generate(prompt_token_ids=[[9, 10, 11], [12, 13]], sampling_params=params)
        ]
        runs.append((one, two))
    assert runs[0] == runs[1] and len(runs[0][1][1]) == 6


@pytest.mark.parametrize("arch,recipe", [("qwen3", "nvfp4"), ("qwen3_5", "mxfp4")])
def test_fp4_dummies_are_held_as_stored_where_the_kernels_run(tmp_path, kernel_backend, arch, recipe):
    """dummy:SHAPE:nvfp4 / mxfp4: the matrices as an FP4 checkpoint's, held as stored with Triton forced
    (Fp4Weight, kernels/fp4_matmul) and dequantized on the naive path: the same greedy tokens. `plan`
    counts what is held: the codes, a scale byte a group and a tensor scale a row; the embedding table and
    the head 16-bit, as FP4 checkpoints keep them."""
    from engine.plan.model import resolve
    from engine.quant.fp4_layer import DenseRows, Fp4Weight

    spec = f"dummy:{_tiny_config(tmp_path, arch)}:{recipe}"
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    kernel_backend("naive")
    dense = LLM(spec, weight_quant="none", max_context=64)
    kernel_backend("triton")
    held = LLM(spec, max_context=64, device=DEVICE, dtype="float32")
    qweights = [m.qweight for m in held.model.modules() if getattr(m, "qweight", None) is not None]
    parts = [p for w in qweights for p in getattr(w, "parts", [w])]
    weights = [p for p in parts if isinstance(p, Fp4Weight)]
    assert weights and all(w.e8m0 == (recipe == "mxfp4") for w in weights)
    # Qwen3.5's in_proj_b / in_proj_a are too small for the recipes (16-bit) beside its FP4 in_proj_qkv / z
    assert any(isinstance(p, DenseRows) for p in parts) == (arch == "qwen3_5")
    prompt = [[5, 6, 7, 8, 9]]
    want = dense.generate(prompt_token_ids=prompt, sampling_params=params)[0].token_ids
    assert held.generate(prompt_token_ids=prompt, sampling_params=params)[0].token_ids == want
    planned = resolve(spec, None, None, None, False, False)
    dense_bytes = sum(p.numel() * 2 for p in held.model.parameters())  # (plan counts 16-bit weights)
    dense_bytes += sum(p.weight.numel() * 2 for p in parts if isinstance(p, DenseRows))
    assert planned.recipe == f"{recipe} as stored" and planned.packed_weights
    assert sum(planned.weights.values()) == sum(w.nbytes for w in weights) + dense_bytes
    preset = resolve(f"dummy:qwen3-8b:{recipe}", None, None, None, False, False).weights
    sixteen_bit = resolve(None, "qwen3-8b", "bf16", None, False, False).weights
    assert preset["embedding"] == sixteen_bit["embedding"] and preset["mlp"] < sixteen_bit["mlp"] * 0.3
