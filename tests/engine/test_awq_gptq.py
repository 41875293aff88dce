"""AWQ, GPTQ and compressed-tensors 4-bit HF checkpoints (engine/formats/hf_intq.py): written here as
AutoAWQ, AutoGPTQ and llm-compressor pack them, from codes, scales and zero points chosen so that every
weight they stand for is exact in fp32 and each -zero x scale exact in fp16; the engine reads them as those
weights (dense on the CPU, packed through the fused kernels when Triton runs), matching transformers run
on the same weights; what it cannot read is refused in a sentence."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zlib

import pytest
import torch
from conftest import hf_logprobs, hold_weights, save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.errors import NinferError
from engine.plan.model import resolve
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert
from engine.quant.cpu import CpuInt4Weight

PROMPT = [5, 9, 200, 31, 77, 5, 9, 300, 12]
CT = "compressed-tensors"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
AUTOAWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ packs column 8 c + ORDER[i] into nibble i of word c


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., W, 8] codes -> [..., W] int32 words, code i in bits 4 i .. 4 i + 3."""
    word = sum(nibbles[..., i].long() << (4 * i) for i in range(8))
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).contiguous()


def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """codes [R, N] -> [R, N / 8] as AutoAWQ's gemm pack writes them."""
    r, n = codes.shape
    return _words(codes.view(r, n // 8, 8)[..., list(AUTOAWQ_ORDER)])


def gptq_pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """codes [K, N] -> [K / 8, N]: row 8 r + i in nibble i of word r (AutoGPTQ's qweight)."""
    k, n = codes.shape
    return _words(codes.view(k // 8, 8, n).permute(0, 2, 1))


def gptq_pack_columns(codes: torch.Tensor) -> torch.Tensor:
    """codes [G, N] -> [G, N / 8]: column 8 c + i in nibble i of word c (AutoGPTQ's qzeros)."""
    g, n = codes.shape
    return _words(codes.view(g, n // 8, 8))


def quantize_exactly(w: torch.Tensor, group: int, min_zero: int = 0, symmetric: bool = False):
    """(codes [K, N], zeros [K / G, N], scales [K / G, N] fp16, the weight [N, K] they stand for) of W [N, K]:
    scales multiples of 1 / 256 (so (q - z) s and -z s are exact); `symmetric`: every zero point 8."""
    n, k = w.shape
    g = w.t().reshape(k // group, group, n)  # [G, group, N]
    lo, hi = g.amin(1).clamp(max=0), g.amax(1).clamp(min=0)
    span = torch.maximum(-lo / 8, hi / 7) if symmetric else (hi - lo) / 15
    scales = (torch.ceil(span * 256).clamp(min=1) / 256).half()
    zeros = torch.full_like(lo, 8) if symmetric else torch.round(-lo / scales.float()).clamp(min_zero, 15)
    codes = torch.round(g / scales.float()[:, None] + zeros[:, None]).clamp(0, 15)
    held = ((codes - zeros[:, None]) * scales.float()[:, None]).reshape(k, n).t()
    return codes.reshape(k, n).to(torch.uint8), zeros.to(torch.uint8), scales, held.contiguous()


def _quantized(name: str, w: torch.Tensor) -> bool:
    """Attention, linear-attention and MLP matrices (each expert's), not the router nor a vision tower's; as
    the tools, none whose output width is not whole words (the tiny hybrid's 4-head in_proj_b / in_proj_a)."""
    matrix = name.endswith(
        ("proj.weight", "in_proj_qkvz.weight", "in_proj_ba.weight")
    )  # (Qwen3-Next's fused)
    return matrix and w.dim() == 2 and w.shape[0] % 8 == 0 and ".visual." not in name


def column_order(k: int, act_order: bool | str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the order columns are quantized in, each column's place in it): for act-order a fixed permutation,
    one for every matrix of K columns (as the tools quantize layers of one input alike), or with
    act_order "own" one for each matrix."""
    if not act_order:
        return torch.arange(k), torch.arange(k)
    seed = zlib.crc32(name.encode()) if act_order == "own" else 7
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    return order, torch.argsort(order)


def save_int4(
    model,
    path,
    method: str,
    group: int = 32,
    fmt: str = "gptq",
    extra_config=None,
    symmetric=False,
    act_order: bool | str = False,
):
    """`model` saved as an AWQ, GPTQ or compressed-tensors checkpoint; the model's own matrices become the
    weights it stands for. `act_order`: each group is columns scattered by a fixed permutation (g_idx)."""
    save_tiny(model, path)
    tensors, held = load_file(path / "model.safetensors"), {}
    out = {}
    for name, w in tensors.items():
        if not _quantized(name, w) or w.shape[1] % group:  # (the tools take whole groups)
            out[name] = w
            continue
        prefix = name[: -len(".weight")]
        min_zero = 1 if fmt == "gptq" and method == "gptq" else 0
        k = w.shape[1]
        order, place = column_order(k, act_order, name)
        codes, zeros, scales, held_in_order = quantize_exactly(w[:, order], group, min_zero, symmetric)
        codes, held[name] = codes[place].contiguous(), held_in_order[:, place]
        g_idx = (place // group).to(torch.int32)
        if method == CT:  # each code and zero point stored plus 8 (stored as is: they are offset already)
            out[f"{prefix}.weight_packed"] = gptq_pack_columns(codes.t().contiguous())  # [N, K / 8]
            out[f"{prefix}.weight_scale"] = scales.t().contiguous()  # [N, K / G]
            if not symmetric:  # [N / 8, K / G], packed along the output dimension
                out[f"{prefix}.weight_zero_point"] = gptq_pack_columns(zeros.contiguous()).t().contiguous()
            out[f"{prefix}.weight_shape"] = torch.tensor(list(w.shape))
            if act_order:
                out[f"{prefix}.weight_g_idx"] = g_idx
            continue
        out[f"{prefix}.scales"] = scales
        if method == "awq":
            out[f"{prefix}.qweight"], out[f"{prefix}.qzeros"] = awq_pack(codes), awq_pack(zeros)
        else:
            stored = zeros - (1 if fmt == "gptq" else 0)  # the original format stores zero - 1
            out[f"{prefix}.qweight"], out[f"{prefix}.qzeros"] = (
                gptq_pack_rows(codes),
                gptq_pack_columns(stored),
            )
            out[f"{prefix}.g_idx"] = g_idx
    save_file(out, path / "model.safetensors")
    quant = {"quant_method": method, "bits": 4, "group_size": group}
    quant.update(
        {"version": "gemm", "zero_point": True}
        if method == "awq"
        else {"desc_act": bool(act_order), "sym": False}
    )
    if method == "gptq":
        quant["checkpoint_format"] = fmt
    if method == CT:
        weights = {
            "num_bits": 4,
            "type": "int",
            "symmetric": symmetric,
            "strategy": "group",
            "group_size": group,
            "actorder": "group" if act_order else None,
        }
        group_0 = {"targets": ["Linear"], "weights": weights}
        quant = {"quant_method": CT, "format": "pack-quantized", "config_groups": {"group_0": group_0}}
    quant.update(extra_config or {})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    hold_weights(model, held)
    return path


CASES = [("awq", "gptq"), ("gptq", "gptq"), ("gptq", "gptq_v2"), (CT, "asymmetric"), (CT, "symmetric")]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("method, fmt", CASES)
def test_read_as_the_weights_they_stand_for(tmp_path, arch, method, fmt):
    model = tiny_hf_model(arch, tied=False, seed=3)
    path = save_int4(model, tmp_path / method, method, fmt=fmt, symmetric=fmt == "symmetric")
    llm = LLM(path, weight_quant="none")
    # the hybrids' gated delta rule sums its chunks in another order than transformers' reference: up to
    # ~2e-4 apart in fp32 on some CPUs (a weight read wrongly is off by far more than either bound)
    bound = 1e-3 if arch in ("qwen3_5", "qwen3_next") else 1e-4
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < bound


@pytest.mark.parametrize("method, fmt", CASES[:2] + CASES[4:])
def test_packed_through_the_fused_kernels(tmp_path, kernel_backend, method, fmt):
    """Where the GPU keeps 4-bit weights packed (Triton forced here), the layers multiply the checkpoint's
    codes as they are: every projection a packed weight, the log-probs transformers'."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_int4(model, tmp_path / method, method, fmt=fmt, symmetric=fmt == "symmetric")
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", device=DEVICE, dtype="float32")
    layer = llm.model.model.layers[0]
    assert layer.self_attn.qkv_proj.qweight is not None and layer.self_attn.qkv_proj.weight is None
    assert layer.mlp.down_proj.qweight is not None
    got = sequence_logprobs(llm, PROMPT).cpu()
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-3


@pytest.mark.parametrize("method, act_order", [("awq", False), ("gptq", True), (CT, False)])
def test_qwen3_next_fused_projections_split_packed(tmp_path, kernel_backend, method, act_order):
    """Qwen3-Next's fused in_proj_qkvz / in_proj_ba, quantized whole: split into Qwen3.5's four projections
    row by row with their codes still packed (act-order's column order kept), so the kernels multiply them
    as stored."""
    model = tiny_hf_model("qwen3_next", tied=False, seed=3)
    path = save_int4(model, tmp_path / method, method, act_order=act_order)
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", device=DEVICE, dtype="float32")
    proj = llm.model.model.layers[0].linear_attn.in_proj  # the four parts' rows, one packed weight
    assert proj.weight is None and proj.qweight.bits == 4
    assert (proj.qweight.columns is not None) == act_order
    # `plan` counts the fused projections packed, as held: less than at 16 bits, at least the parts' bytes
    planned = resolve(str(path), None, None, None, False, False).weights["linear attention"]
    plain = resolve(str(save_tiny(model, tmp_path / "plain")), None, None, None, False, False)
    layers = [m.linear_attn for m in llm.model.model.layers if hasattr(m, "linear_attn")]
    assert sum(a.in_proj.qweight.nbytes for a in layers) <= planned < plain.weights["linear attention"]
    got = sequence_logprobs(llm, PROMPT).cpu()
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-3


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_auto_round_reads_as_the_packing_it_names(tmp_path, method):
    """Intel AutoRound's checkpoints (`quant_method: auto-round`): packed as AutoGPTQ (the default, zero
    points stored minus one) or AutoAWQ packs them; what else it writes is refused in one line."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    auto_round = {"quant_method": "auto-round", "packing_format": f"auto_round:auto_{method}", "sym": True}
    path = save_int4(model, tmp_path / method, method, extra_config=auto_round)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"].pop("checkpoint_format", None)  # (AutoRound writes none)
    (path / "config.json").write_text(json.dumps(config))
    llm = LLM(path, weight_quant="none")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    config["quantization_config"]["packing_format"] = "auto_round:llm_compressor"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NinferError, match="AutoRound int packed as auto_round:llm_compressor; ninfer reads"):
        LLM(path)


def test_cpu_int4_and_conversion(tmp_path):
    """On the CPU `weight_quant auto` runs the 4-bit layers in int4, as the checkpoint stores them; `ninfer
    convert` takes the checkpoint as the weights it stands for (its bf16 recipe: what the same weights
    stored plainly convert to)."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_int4(model, tmp_path / "awq", "awq")
    auto = LLM(path)
    assert isinstance(auto.model.model.layers[0].mlp.down_proj.qweight, CpuInt4Weight)
    assert (sequence_logprobs(auto, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 0.1
    held = save_tiny(model, tmp_path / "held")
    got = []
    for source in (path, held):
        convert(source, tmp_path / f"{source.name}.ninfer", "bf16", method="rtn")
        got.append(sequence_logprobs(LLM(tmp_path / f"{source.name}.ninfer", weight_quant="none"), PROMPT))
    assert torch.equal(got[0], got[1])


def test_plan_counts_the_layers_packed(tmp_path):
    """`ninfer plan` on an AWQ checkpoint: its 4-bit layers at ninfer's packed bytes (codes, fp16 scales and
    minimums per group), not at 16 bits; named by its config.json, the same; a config.json alone, estimated
    at 4 bits in groups of 128."""
    import shutil

    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_int4(model, tmp_path / "awq", "awq")
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.packed_weights and planned.recipe == "AWQ 4-bit (as stored)"
    mlp = sum(
        w.numel() // 2 + w.numel() // 32 * 4
        for n, w in model.named_parameters()
        if ".mlp." in n and n.endswith("proj.weight")
    )
    assert planned.weights["mlp"] == mlp
    assert resolve(str(path / "config.json"), None, None, None, False, False).weights == planned.weights
    (tmp_path / "alone").mkdir()
    shutil.copy(path / "config.json", tmp_path / "alone" / "config.json")
    alone = resolve(str(tmp_path / "alone" / "config.json"), None, None, None, False, False)
    assert alone.recipe == "AWQ 4-bit (estimated from config.json)" and alone.weights["mlp"] < 2 * mlp


@pytest.mark.parametrize(
    "change, words",
    [
        ({"bits": 3}, "gptq at 3 bits; ninfer reads 4 and 8-bit GPTQ checkpoints"),
        ({"bits": 8}, "is asymmetric 8-bit GPTQ; ninfer reads 8-bit GPTQ made with sym: true"),
        ({"checkpoint_format": "marlin"}, "GPTQ in the marlin format"),
        ({"group_size": "x"}, "group_size 'x' is not a positive whole number or -1"),
    ],
)
def test_what_is_not_read_is_refused_before_loading(tmp_path, change, words):
    path = save_int4(tiny_hf_model("qwen3", tied=False), tmp_path / "q", "gptq", extra_config=change)
    with pytest.raises(NinferError, match=re.escape(words)):
        LLM(path)
    done = subprocess.run(
        [sys.executable, "-m", "ninfer_cli.main", "serve", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


def test_awq_other_layouts_and_scattered_groups_are_refused(tmp_path):
    path = save_int4(
        tiny_hf_model("qwen3", tied=False), tmp_path / "a", "awq", extra_config={"version": "gemv"}
    )
    with pytest.raises(NinferError, match="AWQ gemv; ninfer reads AWQ's gemm layout"):
        LLM(path)
    # a group index (in order, or scattered as act-order's) whose groups are not all group_size columns
    for where, act_order in ((-1, False), (0, True)):
        path = save_int4(
            tiny_hf_model("qwen3", tied=False), tmp_path / f"g{where}", "gptq", act_order=act_order
        )
        tensors = load_file(path / "model.safetensors")
        name = "model.layers.0.mlp.up_proj.g_idx"
        tensors[name][where] = (tensors[name][where] + 1) % 2
        save_file(tensors, path / "model.safetensors")
        with pytest.raises(NinferError, match=r"up_proj.* does not give each group 32 columns"):
            LLM(path)


@pytest.mark.parametrize(
    "weights, words",
    [
        ({"strategy": "tensor"}, "its 4-bit groups mix strategies or sizes"),
        ({"num_bits": 8, "symmetric": False}, "quantization_config: compressed-tensors pack-quantized"),
        ({"num_bits": 2}, "quantization_config: compressed-tensors pack-quantized"),
    ],
)
def test_compressed_tensors_that_is_not_read_is_refused(tmp_path, weights, words):
    from engine.formats.hf_quant import checkpoint_quantization

    base = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    groups = {"group_0": {"targets": ["Linear"], "weights": {**base, **weights}}}
    quant = {"quant_method": CT, "format": "pack-quantized", "config_groups": groups}
    with pytest.raises(NinferError, match=re.escape(words)):
        checkpoint_quantization({"architectures": ["Qwen3ForCausalLM"], "quantization_config": quant}, "m")


def test_the_rest_is_arranged_as_its_architecture_stores_it(tmp_path):
    """A Qwen3-VL-MoE AWQ checkpoint whose stacked experts were left 16-bit, stored transposed as published:
    the 4-bit layers packed, the experts arranged as the engine holds them (engine/formats/stacked_experts.py)."""
    from conftest import tiny_vl_model

    model = tiny_vl_model(arch="qwen3_vl_moe")
    path = save_int4(model, tmp_path / "vl_moe", "awq")
    tensors = load_file(path / "model.safetensors")
    experts = [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert experts and "model.language_model.layers.0.self_attn.q_proj.qweight" in tensors
    save_file(
        {n: t.transpose(1, 2).contiguous() if n in experts else t for n, t in tensors.items()},
        path / "model.safetensors",
    )
    llm = LLM(path, weight_quant="none")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def save_int8(model, path, method: str, group: int, fmt: str = "gptq_v2", act_order: bool | str = False):
    """`model` saved as a symmetric 8-bit checkpoint: GPTQ (`fmt` gptq: zero points stored as 127;
    `act_order`: groups of columns scattered by a fixed permutation), compressed-tensors pack-quantized or
    int-quantized (W8A8; group -1: a scale a row); scales multiples of 1 / 4096, so the weights they stand
    for are exact. The model's matrices become those weights."""
    save_tiny(model, path)
    tensors, held, out = load_file(path / "model.safetensors"), {}, {}
    for name, w in tensors.items():
        if not _quantized(name, w):
            out[name] = w
            continue
        prefix, (n, k) = name[: -len(".weight")], w.shape
        g = k if group == -1 else group
        order, place = column_order(k, act_order, name)
        rows = w[:, order].reshape(n, k // g, g)
        scales = (torch.ceil(rows.abs().amax(-1) / 127 * 4096).clamp(min=1) / 4096).half()  # [N, K / g]
        codes = torch.round(rows / scales.float()[..., None]).clamp(-127, 127)
        held[name] = (codes * scales.float()[..., None]).reshape(n, k)[:, place]
        codes = codes.reshape(n, k)[:, place]
        stored = (codes + 128).to(torch.uint8)  # [N, K]
        if method == "gptq":  # qweight [K / 4, N]: a byte a row; qzeros [K / G, N / 4]
            out[f"{prefix}.qweight"] = (
                stored.t().reshape(k // 4, 4, n).permute(0, 2, 1).contiguous().view(torch.int32)[..., 0]
            )
            zeros = torch.full((k // g, n), 127 if fmt == "gptq" else 128, dtype=torch.uint8)
            out[f"{prefix}.qzeros"] = zeros.view(k // g, n // 4, 4).contiguous().view(torch.int32)[..., 0]
            out[f"{prefix}.scales"] = scales.t().contiguous()
            out[f"{prefix}.g_idx"] = (place // g).to(torch.int32)
        elif method == CT:  # weight_packed [N, K / 4]: a byte a column
            out[f"{prefix}.weight_packed"] = stored.view(n, k // 4, 4).contiguous().view(torch.int32)[..., 0]
            out[f"{prefix}.weight_scale"] = scales
        else:  # int-quantized: the int8 weight itself
            out[f"{prefix}.weight"] = codes.to(torch.int8)
            out[f"{prefix}.weight_scale"] = scales
        if method != "gptq" and act_order:
            out[f"{prefix}.weight_g_idx"] = (place // g).to(torch.int32)
    save_file(out, path / "model.safetensors")
    if method == "gptq":
        quant = {
            "quant_method": "gptq",
            "bits": 8,
            "group_size": group,
            "sym": True,
            "checkpoint_format": fmt,
            "desc_act": bool(act_order),
        }
    else:
        strategy = {"strategy": "channel"} if group == -1 else {"strategy": "group", "group_size": group}
        weights = {"num_bits": 8, "type": "int", "symmetric": True, **strategy}
        weights["actorder"] = "group" if act_order else None
        fmt_name = "pack-quantized" if method == CT else "int-quantized"
        quant = {"quant_method": CT, "format": fmt_name, "config_groups": {"g": {"weights": weights}}}
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    hold_weights(model, held)
    return path


EIGHT_BIT = [("gptq", "gptq", 32), ("gptq", "gptq_v2", -1), (CT, "", 32), ("int8", "", -1), ("int8", "", 32)]


@pytest.mark.parametrize("method, fmt, group", EIGHT_BIT)
def test_eight_bit_read_as_the_weights_they_stand_for(tmp_path, method, fmt, group):
    """Symmetric 8-bit GPTQ and compressed-tensors (packed W8A16, int8 W8A8; a scale a group or a row):
    ninfer's 8-bit groups, the CPU's int8 and the packed kernels all give transformers' logprobs."""
    model = tiny_hf_model("qwen3_moe", tied=False, seed=3)
    path = save_int8(model, tmp_path / "m", method, group, fmt)
    dense = LLM(path, weight_quant="none")
    assert (sequence_logprobs(dense, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    planned = resolve(str(path), None, None, None, False, False)
    assert planned.packed_weights and planned.recipe.endswith("8-bit (as stored)")


@pytest.mark.parametrize("method, fmt, group", EIGHT_BIT[::2])
def test_eight_bit_packed_through_the_fused_kernels(tmp_path, kernel_backend, method, fmt, group):
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_int8(model, tmp_path / "m", method, group, fmt)
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", device=DEVICE, dtype="float32")
    weight = llm.model.model.layers[0].mlp.down_proj.qweight
    assert weight is not None and weight.bits == 8
    got = sequence_logprobs(llm, PROMPT).cpu()
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-3


@pytest.mark.parametrize("method, fmt", [("gptq", "gptq"), (CT, "symmetric"), (CT, "asymmetric")])
def test_act_order_layers_read_as_the_weights_they_stand_for(tmp_path, method, fmt):
    """GPTQ's desc_act / compressed-tensors' actorder scatter each group over the input columns (g_idx): the
    layers are held as groups of their columns sorted by group, with that order; dequantized (the CPU) they
    are the weights the checkpoint stands for. `plan` counts them packed, plus their order (int32 a
    column), the experts too."""
    model = tiny_hf_model("qwen3_moe", tied=False, seed=3)
    path = save_int4(model, tmp_path / "m", method, fmt=fmt, symmetric=fmt == "symmetric", act_order=True)
    llm = LLM(path, weight_quant="none")
    assert llm.description.endswith("4-bit act-order")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4
    planned = resolve(str(path), None, None, None, False, False)
    assert (
        planned.packed_weights
        and planned.recipe == f"{'GPTQ' if method == 'gptq' else CT} 4-bit act-order (as stored)"
    )
    attention = sum(
        w.numel() // 2 + w.numel() // 32 * 4 + 4 * w.shape[1]
        for n, w in model.named_parameters()
        if ".self_attn." in n and n.endswith("proj.weight")
    )
    assert planned.weights["attention"] == attention
    assert planned.weights["mlp"] < sum(w.numel() for n, w in model.named_parameters() if ".mlp." in n)


@pytest.mark.parametrize(
    "method, fmt, bits, orders",
    [
        ("gptq", "gptq", 4, "shared"),
        ("gptq", "gptq_v2", 4, "own"),
        (CT, "asymmetric", 4, "own"),
        ("gptq", "gptq", 8, "shared"),
        ("int8", "", 8, "own"),
    ],
)
def test_act_order_layers_packed_through_the_fused_kernels(
    tmp_path, kernel_backend, method, fmt, bits, orders
):
    """Where the GPU keeps weights packed (Triton forced here), an act-order layer multiplies the checkpoint's
    codes with its input columns gathered in their stored order: every projection packed, the log-probs
    transformers'. `orders` own: each matrix its own column order, so a fused projection's shards (q | k | v,
    gate | up) are packed apart, each gathering x its way."""
    from engine.quant.layer import ConcatenatedWeights

    model = tiny_hf_model("qwen3", tied=False, seed=3)
    act_order = True if orders == "shared" else "own"
    if bits == 4:
        path = save_int4(model, tmp_path / "m", method, fmt=fmt, act_order=act_order)
    else:
        path = save_int8(model, tmp_path / "m", method, 32, fmt, act_order=act_order)
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", device=DEVICE, dtype="float32")
    attn, mlp = llm.model.model.layers[0].self_attn, llm.model.model.layers[0].mlp
    assert attn.qkv_proj.weight is None and mlp.down_proj.weight is None
    assert mlp.down_proj.qweight.columns is not None and mlp.down_proj.qweight.bits == bits
    assert isinstance(attn.qkv_proj.qweight, ConcatenatedWeights) == (orders == "own")
    got = sequence_logprobs(llm, PROMPT).cpu()
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-3


def test_act_order_prompt_chunks_take_int8_activations(tmp_path, kernel_backend):
    """--int8-prefill over act-order layers: x's columns gathered before they are quantized per group, so
    the int8 products are near the 16-bit ones (as for any packed weight: tests/engine/test_int8_prefill)."""
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    path = save_int4(model, tmp_path / "m", "gptq", act_order="own")
    kernel_backend("triton")
    options = dict(device=DEVICE, weight_quant="none", dtype="float32")
    prompt = list(range(40, 80))
    want = sequence_logprobs(LLM(path, **options), prompt)
    got = sequence_logprobs(LLM(path, **options, int8_prefill=True, max_concurrency=9), prompt)
    kl = (want.exp() * (want - got)).sum(-1)  # [T]
    assert kl.mean() < 2e-2 and kl.max() < 0.1, kl


@pytest.mark.parametrize("orders", ["shared", "own"])
def test_act_order_experts_packed_where_the_kernels_run(tmp_path, kernel_backend, orders):
    """Act-order experts stay packed, the grouped kernel gathering x's columns in each expert's order
    (PackedExperts.columns); where an expert's gate and up were quantized in different orders (`own`: each
    matrix its own) that stack is dequantized instead (the kernel gathers x once for both)."""
    model = tiny_hf_model("qwen3_moe", tied=False, seed=3)
    path = save_int4(model, tmp_path / "m", "gptq", act_order=True if orders == "shared" else "own")
    kernel_backend("triton")
    llm = LLM(path, weight_quant="none", device=DEVICE, dtype="float32")
    layer = llm.model.model.layers[0]
    assert layer.self_attn.o_proj.qweight.columns is not None
    experts = layer.mlp.experts  # (down_proj's K is one group here: in order, no columns)
    assert experts.packed["down_proj"].columns is None
    if orders == "shared":
        assert experts.packed["gate_up_proj"].columns.shape == (experts.num_experts, 64)
    else:
        assert "gate_up_proj" not in experts.packed and experts.gate_up_proj is not None
    got = sequence_logprobs(llm, PROMPT).cpu()
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-3


@pytest.mark.parametrize("method, fmt", [("gptq", "gptq"), (CT, ""), ("int8", "")])
def test_eight_bit_act_order_read_as_the_weights_they_stand_for(tmp_path, method, fmt):
    model = tiny_hf_model("qwen3", tied=False, seed=3)
    llm = LLM(save_int8(model, tmp_path / "m", method, 32, fmt, act_order=True), weight_quant="none")
    assert llm.description.endswith("8-bit act-order")
    assert (sequence_logprobs(llm, PROMPT) - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_ollama_names_the_quantization(tmp_path):
    """/api/show's quantization_level for a quantized checkpoint folder: what its quantization_config says."""
    from types import SimpleNamespace

    from engine.api.ollama import _quantization

    def level(path):
        return _quantization(SimpleNamespace(engine_config=SimpleNamespace(model=str(path))))

    model = tiny_hf_model("qwen3", tied=False)
    assert level(save_int4(model, tmp_path / "a", "awq")) == "AWQ_4-BIT"
    assert level(save_int4(model, tmp_path / "g", "gptq", act_order=True)) == "GPTQ_4-BIT_ACT-ORDER"
    assert level(save_int8(model, tmp_path / "w", "int8", -1)) == "COMPRESSED-TENSORS_8-BIT"
