"""Group-wise quantization round trips, the .ninfer container (versions, corruption) and `ninfer convert`."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.formats.container import MAX_READ_VERSION, read_header
from engine.models.loader import default_model_path
from engine.quant.convert import convert
from engine.quant.groupwise import dequantize, pack, quantize
from engine.quant.recipes import BASE, Q46_OPTIONS, mixed_plan, stored_bits
from ninfer_kernels.quant_matmul.naive import unpack

# RMS-relative reconstruction error of Gaussian weights with one outlier, per width (measured over these
# shapes: up to 0.10, 0.025, 0.0084): the grid step halves per added bit; 8 bits is symmetric, so its
# step is set by max|w| rather than the range
ROUND_TRIP = {4: 0.12, 6: 0.035, 8: 0.012}


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("k", [128, 1000, 77])
def test_round_trip_error_bounds(bits, k):
    torch.manual_seed(bits)
    w = torch.randn(64, k) * 0.02
    w[3, 5] = 0.4  # an outlier that the clipping search must not let spoil its group
    qt = quantize(w, bits, 128)
    assert qt.packed.shape[1] == {4: 64, 6: 96, 8: 128}[bits] * -(-k // 128)
    assert unpack(qt.packed, bits).shape == (64, -(-k // 128) * 128)
    rel = ((dequantize(qt) - w).norm() / w.norm()).item()
    assert rel < ROUND_TRIP[bits]
    assert qt.bits_per_weight <= stored_bits((bits, 128)) * (-(-k // 128) * 128) / k + 1e-6


def test_clipping_search_beats_round_to_nearest():
    torch.manual_seed(0)
    w = torch.randn(32, 256) * 0.02
    w[:, 0] = 0.3
    searched = (dequantize(quantize(w, 4)) - w).norm()
    plain = (dequantize(quantize(w, 4, clip_search=False)) - w).norm()
    assert searched < plain


@pytest.mark.parametrize("bits,top", [(4, 16), (6, 64)])
def test_pack_unpack_is_exact(bits, top):
    codes = torch.randint(0, top, (5, 256))
    assert torch.equal(unpack(pack(codes, bits), bits), codes)


def test_mixed_plan_buys_the_largest_error_drop_per_bit_within_budget():
    numel = dict.fromkeys("abcd", 1000)
    # squared reconstruction errors per option: halving per bit; "d" is a 4-bit-g32 source (exact at g32)
    errors = {n: {BASE: 1.0, (4, 32): 0.5, (6, 128): 0.06, (8, 128): 0.004} for n in "abc"}
    errors["d"] = {BASE: 1.0, (4, 32): 0.0, (6, 128): 0.06, (8, 128): 0.004}
    plan = mixed_plan({"a": 5.0, "b": 0.1, "c": 0.01, "d": 2.0}, numel, errors, target_bits=5.0)
    assert plan.options["c"] == BASE  # the least sensitive stays at 4 bits, group 128
    assert plan.options["d"] == (4, 32)  # exact for its source: the cheapest full fix
    assert plan.options["a"] != BASE
    avg = sum(stored_bits(o) for o in plan.options.values()) / 4
    assert avg <= 5.0 and set(plan.options.values()) <= set(Q46_OPTIONS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(
        tiny_hf_model("qwen3", tied=False, seed=2, hidden_size=128, intermediate_size=256),
        tmp_path_factory.mktemp("src"),
    )


@pytest.mark.parametrize("recipe", ["bf16", "w8g128", "w6g128", "w4g128", "q4.6"])
def test_converted_model_loads_and_generates(tiny, tmp_path, recipe):
    out = tmp_path / f"m-{recipe}.ninfer"
    rows = convert(tiny, out, recipe)
    assert rows and out.exists() and not list(tmp_path.glob("*.partial"))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = list(range(20, 50))
    got = LLM(out, dtype="bfloat16").generate(prompt_token_ids=prompt, sampling_params=params)[0]
    assert len(got.token_ids) == 12
    if recipe == "bf16":  # the same bf16 weights as the source loaded in bf16: the same tokens
        want = LLM(tiny, dtype="bfloat16").generate(prompt_token_ids=prompt, sampling_params=params)[0]
        assert got.token_ids == want.token_ids
    if recipe == "w8g128":  # 8-bit: logits close to the source's
        ref = LLM(tiny, weight_quant="none").generate(
            prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)
        )[0]
        q = LLM(out, weight_quant="none").generate(
            prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)
        )[0]
        t = ref.token_ids[0]
        assert abs(q.logprobs[0].get(t, -99.0) - ref.logprobs[0][t]) < 0.1


def test_container_keeps_tokenizer_and_chat_template(tmp_path, monkeypatch):
    out = tmp_path / "smol.ninfer"
    # 8 bits are rounded to nearest even under GPTQ: nothing runs the model on calibration text
    monkeypatch.setattr("engine.quant.convert.calibration_llm", lambda src: pytest.fail("calibrated w8g128"))
    convert(default_model_path(), out, "w8g128")
    llm = LLM(out)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert llm.tokenizer.encode_chat(messages) == LLM().tokenizer.encode_chat(messages)
    assert "Paris" in llm.chat(messages, SamplingParams(max_tokens=24, temperature=0.0)).text


def _rewrite_metadata(path, **changes):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"].update(changes)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])


def test_container_versions_and_corruption(tiny, tmp_path):
    out = tmp_path / "m.ninfer"
    convert(tiny, out, "w4g128")
    assert read_header(out)["__metadata__"]["container_version"] == "1"
    assert read_header(out) is read_header(out)  # the loader and the planner share one parse
    newer = tmp_path / "newer.ninfer"
    newer.write_bytes(out.read_bytes())
    _rewrite_metadata(newer, container_version=str(MAX_READ_VERSION + 1))
    with pytest.raises(NinferError) as e:
        LLM(newer)
    assert str(e.value) == (
        f"this artifact is container v{MAX_READ_VERSION + 1}; this ninfer reads v1–v{MAX_READ_VERSION} — upgrade "
        f"ninfer, or fetch a revision that holds a v{MAX_READ_VERSION} artifact (ninfer fetch --revision <commit>)"
    )
    truncated = tmp_path / "cut.ninfer"
    truncated.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    with pytest.raises(NinferError, match="cut.ninfer is corrupt: truncated"):
        LLM(truncated)
    plain = tmp_path / "plain.ninfer"
    plain.write_bytes((tiny / "model.safetensors").read_bytes())
    with pytest.raises(NinferError, match="not a .ninfer container"):
        LLM(plain)
    garbage = tmp_path / "garbage.ninfer"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(NinferError, match="garbage.ninfer is corrupt"):
        LLM(garbage)


def test_cli_convert_prints_a_summary_and_refuses_bad_input(tiny, tmp_path):
    out = tmp_path / "cli.ninfer"
    run = [sys.executable, "-m", "ninfer_cli.main", "convert", str(tiny), str(out), "--recipe", "w4g128"]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "model.layers.*.mlp.down_proj.weight" in proc.stdout and "bits/weight" in proc.stdout
    assert out.exists()
    bad = subprocess.run(run[:-1] + ["w5"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown recipe 'w5'")
    method = subprocess.run(run + ["--method", "awq"], capture_output=True, text=True, timeout=300)
    assert method.returncode == 2 and method.stderr.startswith(
        "error: unknown method 'awq'; use one of gptq, rtn"
    )
    wrong = subprocess.run(run[:5] + [str(tmp_path / "x.bin")], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and "must end in .ninfer" in wrong.stderr
