"""Qwen3-MoE (Qwen3MoeForCausalLM): the engine against transformers on tiny random checkpoints, both
checkpoint layouts of the experts, the refusals, and the mixture-of-experts ops' naive twins."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_logprobs, save_tiny, tiny_hf_model
from safetensors.torch import load_file, save_file

import ninfer_kernels as kernels
from engine import LLM, SamplingParams
from engine.bench.roofline import cost_of_llm
from engine.errors import NinferError
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert

PROMPT = list(range(10, 40))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton-forced engines


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    model = tiny_hf_model("qwen3_moe", tied=False)
    return model, save_tiny(model, tmp_path_factory.mktemp("qwen3_moe"))


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # sparse, dense (mlp_only_layers), sparse; routing renormalised
        {"norm_topk_prob": False, "mlp_only_layers": [], "decoder_sparse_step": 2, "num_experts_per_tok": 3},
    ],
)
def test_logprobs_match_transformers(tmp_path, overrides):
    model = tiny_hf_model("qwen3_moe", tied=False, seed=1, **overrides)
    llm = LLM(save_tiny(model, tmp_path), weight_quant="none")
    layers = llm.model.model.layers
    sparse = [type(layer.mlp).__name__ == "SparseMoE" for layer in layers]
    assert sparse == ([True, False, True] if not overrides else [False, True, False])
    got = sequence_logprobs(llm, PROMPT)
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_greedy_generation_matches_transformers(moe):
    """Two prompts at once (prefill, then decode steps through the paged KV cache)."""
    model, path = moe
    prompts = [[5, 9, 200, 31, 77, 5, 9], list(range(40, 60))]
    got = LLM(path, weight_quant="none").generate(
        prompt_token_ids=prompts,
        sampling_params=SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    )
    for prompt, out in zip(prompts, got):
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :]
        assert out.token_ids == want.tolist()


def test_stacked_expert_checkpoints_load_the_same(moe, tmp_path):
    """transformers holds the experts stacked (gate_up_proj [E, 2I, H], down_proj [E, H, I]); a checkpoint
    saved that way loads into the same parameters."""
    model, path = moe
    tensors = load_file(path / "model.safetensors")
    for layer in (0, 2):
        base = f"model.layers.{layer}.mlp.experts"
        experts = range(8)
        gate_up = [
            torch.cat([tensors.pop(f"{base}.{e}.{k}_proj.weight") for k in ("gate", "up")]) for e in experts
        ]
        tensors[f"{base}.gate_up_proj"] = torch.stack(gate_up)
        tensors[f"{base}.down_proj"] = torch.stack(
            [tensors.pop(f"{base}.{e}.down_proj.weight") for e in experts]
        )
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    got = sequence_logprobs(LLM(tmp_path, weight_quant="none"), PROMPT)
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-4


def test_a_missing_expert_or_expert_count_is_refused(moe, tmp_path):
    _, path = moe
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.5.down_proj.weight"]
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(NinferError, match=r"lacks model\.layers\.2\.mlp\.experts\.down_proj \[down:5\]"):
        LLM(tmp_path)
    config.pop("num_local_experts", None)
    config.pop("num_experts", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NinferError, match="lacks num_experts"):
        LLM(tmp_path)


def test_through_the_triton_path_and_a_converted_artifact(moe, tmp_path, kernel_backend):
    """The other ops through Triton (interpreted here) beside the experts' twin; a w8g128 .ninfer keeps the
    router unquantized and generates."""
    model, path = moe
    kernel_backend("triton")
    # (fp32 on a GPU too: at its default bf16 a routing choice can flip, a few nats at that position)
    got = sequence_logprobs(LLM(path, weight_quant="none", device=DEVICE, dtype="float32"), PROMPT).cpu()
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 1e-3
    kernel_backend("")
    rows = convert(path, tmp_path / "m.ninfer", "w8g128", method="rtn")
    bits = {r["kind"]: r["bits"] for r in rows}
    assert (
        bits["model.layers.*.mlp.gate.weight"] == "32"
        and bits["model.layers.*.mlp.experts.*.up_proj.weight"] == "8"
    )
    out = LLM(tmp_path / "m.ninfer").generate(
        prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=4, ignore_eos=True)
    )
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_twin_equals_every_expert_masked(renormalize, dtype):
    """moe_route + fused_moe against a dense reference: every expert on every token, weighted by the
    router's top-k probabilities (zero elsewhere)."""
    torch.manual_seed(0)
    tokens, hidden, inter, experts, k = 13, 32, 24, 6, 3
    x = torch.randn(tokens, hidden).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden) * 0.2).to(dtype)
    down = (torch.randn(experts, hidden, inter) * 0.2).to(dtype)
    logits = torch.randn(tokens, experts)
    weights, ids = kernels.moe_route(logits, k, renormalize)
    probs = torch.softmax(logits, -1)
    assert ids.shape == (tokens, k) and (probs.gather(1, ids) >= probs.topk(k).values[:, -1:]).all()
    assert torch.allclose(weights.sum(-1), torch.ones(tokens)) == renormalize
    dense = torch.zeros(tokens, experts).scatter(1, ids, weights)  # [T, E]
    want = torch.zeros(tokens, hidden)
    for e in range(experts):
        g, u = (x.float() @ gate_up[e].float().t()).chunk(2, -1)
        want += dense[:, e : e + 1] * ((torch.nn.functional.silu(g) * u) @ down[e].float().t())
    got = kernels.fused_moe(x, gate_up, down, weights, ids)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ((got.float() - want).norm() / want.norm()) < tol


def test_packed_experts_run_the_triton_kernel_and_count_as_held(moe, tmp_path, kernel_backend):
    """Where the GPU keeps a .ninfer packed (Triton forced here), every expert's matrices stay packed,
    stacked (engine/layers/moe.pack_experts), and run the grouped kernel: the log-probs of the dequantized
    CPU engine's; the plan's weights (artifact_weight_bytes) count them as held."""
    from engine.plan.weights import artifact_weight_bytes

    _, path = moe
    for recipe in ("w4g128", "q4.6"):
        out = tmp_path / f"{recipe}.ninfer"
        kernel_backend("")  # converting (q4.6 measures each matrix's error) and the reference: naive ops
        convert(path, out, recipe, method="rtn")
        want = sequence_logprobs(LLM(out, weight_quant="none"), PROMPT)
        kernel_backend("triton")
        # (fp32 on a GPU too, whose default is bf16: the plan counts fp32 bytes, the log-probs are fp32's)
        llm = LLM(out, weight_quant="none", device=DEVICE, dtype="float32")
        experts = llm.model.model.layers[0].mlp.experts
        if recipe == "w4g128":
            assert set(experts.packed) == {"gate_up_proj", "down_proj"} and experts.gate_up_proj is None
        packed = {id(m.qweight): m.qweight.nbytes for m in llm.model.modules() if getattr(m, "qweight", None)}
        stacks = [p for m in llm.model.modules() if hasattr(m, "packed") for p in m.packed.values()]
        held = sum(packed.values()) + sum(p.numel() * p.element_size() for p in llm.model.parameters())
        held += sum(
            t.numel() * t.element_size()
            for p in stacks
            for t in (p.packed, p.scales, p.minimums)
            if t is not None
        )
        planned = artifact_weight_bytes(out, llm.model_config, dtype_bytes=4)
        assert held == sum(planned.values())
        assert cost_of_llm(llm).expert_bytes == planned["experts"] > 0  # bench's roofline, as held
        got = sequence_logprobs(llm, PROMPT).cpu()
        assert (got - want).abs().max() < 1e-3


def test_the_roofline_counts_the_experts_a_step_routes_to(moe):
    """bench's roofline: a token multiplies top_k of a layer's experts (prefill FLOPs), and a decode step of
    S tokens reads the share 1 - (1 - top_k / E)^S of every layer's stacked experts (routing spread
    evenly): the weights read every step are the rest."""
    from engine.bench.roofline import matmul_weights
    from engine.plan.shapes import model_tensors

    _, path = moe
    llm = LLM(path, weight_quant="none")
    cfg = llm.model_config
    stacks = [p for n, p in llm.model.named_parameters() if ".mlp.experts." in n]
    experts = sum(p.numel() * p.element_size() for p in stacks)
    cost = cost_of_llm(llm)
    assert cost.expert_bytes == experts > 0
    others = sum(
        p.numel() * p.element_size() for n, p in llm.model.named_parameters() if ".experts." not in n
    )
    table = llm.model.model.embed_tokens.weight
    assert cost.weight_bytes == others - table.numel() * table.element_size()  # the lookup is one row
    k, e = cfg.num_experts_per_tok, cfg.num_experts
    for streams in (1, 2, 64):
        share = 1 - (1 - k / e) ** streams
        assert cost.decode_bytes(0, streams) == pytest.approx(cost.weight_bytes + experts * share)
    dense = sum(s[0] * s[1] for n, s in model_tensors(cfg) if len(s) == 2 and "embed_tokens" not in n) + (
        cfg.vocab_size * cfg.hidden_size if cfg.tie_word_embeddings else 0
    )
    assert matmul_weights(cfg) == dense + sum(p.numel() for p in stacks) * k // e


def test_experts_quantized_differently_are_not_packed(moe):
    """pack_experts stacks a layer's experts only when all are quantized alike (q4.6 chooses per matrix);
    otherwise the loader dequantizes them into the dense stack."""
    from engine.layers.moe import pack_experts
    from engine.quant.groupwise import quantize

    _, path = moe
    llm = LLM(path, weight_quant="none")
    pname = "model.layers.0.mlp.experts.down_proj"
    param = llm.model.get_parameter(pname)
    shards = {f"down:{e}": quantize(torch.randn(64, 32), 4, 32, False) for e in range(8)}
    assert (
        pack_experts(
            llm.model, pname, param, {**shards, "down:3": quantize(torch.randn(64, 32), 8, 32, False)}, "cpu"
        )
        is False
    )
    assert pack_experts(llm.model, "model.layers.0.mlp.gate.weight", param, shards, "cpu") is False
    assert pack_experts(llm.model, pname, param, shards, "cpu") is True
    experts = llm.model.model.layers[0].mlp.experts
    assert experts.down_proj is None and experts.packed["down_proj"].packed.shape == (8, 64, 16)


def test_plan_counts_a_recipes_experts_as_the_artifact_holds_them(moe, tmp_path):
    """`ninfer plan MODEL --recipe w4g128` on the HF directory predicts the weights the converted artifact
    holds on the GPU (its experts packed): within the rounding of the per-kind estimate."""
    from engine.plan.weights import artifact_weight_bytes, recipe_weight_bytes

    _, path = moe
    convert(path, tmp_path / "m.ninfer", "w4g128", method="rtn")
    llm = LLM(path, weight_quant="none")
    predicted = recipe_weight_bytes(llm.model_config, "w4g128", dtype_bytes=2)
    held = artifact_weight_bytes(tmp_path / "m.ninfer", llm.model_config, dtype_bytes=2)
    assert predicted["mlp"] == held["mlp"] and predicted["experts"] == held["experts"] > 0


def test_qwen3_5_moe_hybrid_matches_transformers(tmp_path):
    """Qwen3.5-MoE: the hybrid (Gated DeltaNet + gated attention) with every layer a mixture of experts plus
    a shared expert under a sigmoid gate, routing always renormalised; log-probs and greedy tokens."""
    model = tiny_hf_model("qwen3_5_moe", tied=False, seed=2)
    llm = LLM(save_tiny(model, tmp_path), weight_quant="none")
    assert llm.model_config.shared_expert_intermediate_size == 48 and llm.model_config.norm_topk_prob
    got = sequence_logprobs(llm, PROMPT)
    # fp32 summation order through the recurrent layers: ~1e-4 by the 30th position
    assert (got - hf_logprobs(model, PROMPT)).abs().max() < 5e-4
    out = llm.generate(
        prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=6, temperature=0.0)
    )
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False)[0, len(PROMPT) :]
    assert out[0].token_ids == want.tolist()


def _stacked(tensors: dict[str, torch.Tensor], num_experts: int, transposed: bool) -> dict[str, torch.Tensor]:
    """A per-expert checkpoint's experts stacked as transformers holds them (gate_up_proj [E, 2I, H],
    down_proj [E, H, I]), or stored the other way round (as Qwen3-VL-MoE's published checkpoints are)."""
    out = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    bases = sorted({k.split(".mlp.experts.")[0] for k in tensors if ".mlp.experts." in k})
    for base in bases:
        e = f"{base}.mlp.experts"
        gate_up = torch.stack(
            [
                torch.cat([tensors[f"{e}.{i}.gate_proj.weight"], tensors[f"{e}.{i}.up_proj.weight"]])
                for i in range(num_experts)
            ]
        )
        down = torch.stack([tensors[f"{e}.{i}.down_proj.weight"] for i in range(num_experts)])
        if transposed:
            gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
        out[f"{e}.gate_up_proj"], out[f"{e}.down_proj"] = gate_up, down
    return out


@pytest.mark.parametrize("experts", ["per_expert", "stacked", "stacked_transposed", "published"])
def test_qwen3_5_moe_as_published_loads(tmp_path, experts):
    """The published Qwen3.5 / Qwen3.6-35B-A3B config.json names no intermediate_size (every layer is a
    mixture of experts), and a checkpoint may store its experts stacked, either way round: each loads and
    gives transformers' greedy tokens. `published`: as the 35B-A3B repositories hold it, the multimodal
    wrapper's config (text_config) and names (model.language_model.*) with the experts stacked [E, 2I, H]
    and [E, H, I]. (Experts 24 wide, so that no stack is square: 2I != H.)"""
    model = tiny_hf_model("qwen3_5_moe", tied=False, seed=2, moe_intermediate_size=24)
    path = save_tiny(model, tmp_path)
    config = json.loads((path / "config.json").read_text())
    del config["intermediate_size"]
    if experts == "published":
        text = {k: v for k, v in config.items() if k != "architectures"} | {"model_type": "qwen3_5_moe_text"}
        config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}
        config |= {"text_config": text, "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps(config))
    if experts != "per_expert":
        weights = _stacked(load_file(str(path / "model.safetensors")), 8, experts == "stacked_transposed")
        if experts == "published":
            weights = {k.replace("model.", "model.language_model.", 1): v for k, v in weights.items()}
        save_file(weights, str(path / "model.safetensors"))
    llm = LLM(path, weight_quant="none")
    assert llm.model_config.intermediate_size == 48  # the shared expert's width, the widest
    out = llm.generate(
        prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=6, temperature=0.0)
    )
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False)[0, len(PROMPT) :]
    assert out[0].token_ids == want.tolist()


def test_a_config_without_a_dense_width_is_refused_in_a_sentence(tmp_path):
    """A dense model's config.json (or an MoE one with dense layers) that names no intermediate_size, or one
    that lacks hidden_size, is refused in a sentence rather than a KeyError."""
    from engine.config import ModelConfig

    config = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32}
    config |= {"num_attention_heads": 2, "num_hidden_layers": 2}
    with pytest.raises(NinferError, match="lacks intermediate_size"):
        ModelConfig.from_hf_dict(config)
    del config["hidden_size"]
    with pytest.raises(NinferError, match="lacks hidden_size"):
        ModelConfig.from_hf_dict(config)
