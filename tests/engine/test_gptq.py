"""GPTQ-style quantization: lower output error than round-to-nearest under the layer's input statistics,
the same stored format, activation statistics from the engine, and `convert --method`."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

import engine.quant.gptq as gptq
from engine import LLM, NinferError
from engine.layers.linear import Linear
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert
from engine.quant.gptq import gptq_quantize
from engine.quant.groupwise import dequantize, quantize
from engine.quant.hessians import attention_mass, collect_hessians, hessian_bytes
from ninfer_kernels.quant_matmul.naive import unpack


def correlated_inputs(k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g) * 0.2 + torch.eye(k)
    x = torch.randn(2048, k, generator=g) @ mix
    x[:, 3] *= 20.0  # one loud input channel, as real activations have
    return x


@pytest.mark.parametrize("act_order", [True, False])
@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("k", [256, 576])  # 576: groups of 64
def test_output_error_below_round_to_nearest(bits, k, act_order, monkeypatch):
    monkeypatch.setattr(gptq, "ACT_ORDER", act_order)
    w = torch.randn(96, k, generator=torch.Generator().manual_seed(bits))
    x = correlated_inputs(k, seed=k)
    compensated, rounded = gptq_quantize(w, x.t() @ x, bits), quantize(w, bits)
    fields = ("bits", "group_size", "shape", "nbytes")
    assert [getattr(compensated, f) for f in fields] == [getattr(rounded, f) for f in fields]

    def output_error(qt):
        return ((x @ (dequantize(qt) - w).t()).norm() / (x @ w.t()).norm()).item()

    assert output_error(compensated) < 0.8 * output_error(rounded)  # measured 0.56-0.61x


def test_inputs_never_active_are_harmless():
    w = torch.randn(16, 128)
    x = correlated_inputs(128, seed=1)
    x[:, 10] = 0.0  # a dead input: a zero row and column in H
    qt = gptq_quantize(w, x.t() @ x, 4)
    assert torch.isfinite(dequantize(qt)).all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(
        tiny_hf_model("llama", tied=False, seed=5, hidden_size=128, intermediate_size=256),
        tmp_path_factory.mktemp("src"),
    )


def test_hessians_are_each_linear_layers_input_statistics(tiny):
    llm = LLM(tiny, weight_quant="none", enable_prefix_caching=False)
    tokens = torch.randint(3, 500, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    hessians = collect_hessians(llm, tokens, window=128)
    linears = {f"{n}.weight": m for n, m in llm.model.named_modules() if isinstance(m, Linear)}
    plain = {key for key in hessians if isinstance(key, str)}
    assert plain == set(linears)
    for name in plain:
        k, h = linears[name].in_features, hessians[name]
        assert h.shape == (k, k) and torch.allclose(h, h.t(), atol=1e-3 * h.abs().max())
    # the head's inputs are the final hidden states of every position: H = sum of their outer products
    hidden = []
    hook = llm.model.lm_head.register_forward_pre_hook(lambda mod, args: hidden.append(args[0].float()))
    for start in range(0, 300, 128):
        sequence_logprobs(llm, tokens[start : start + 128])
    hook.remove()
    x = torch.cat(hidden)
    assert torch.allclose(hessians["lm_head.weight"], x.t() @ x, rtol=1e-4, atol=1e-3)


def test_key_and_value_rows_weigh_tokens_by_the_attention_they_receive(tiny):
    llm = LLM(tiny, weight_quant="none", enable_prefix_caching=False)
    tokens = torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    hessians = collect_hessians(llm, tokens, window=128)
    layer = llm.model.model.layers[1]
    name = "model.layers.1.self_attn.qkv_proj.weight"
    per_head = hessians[(name, "v")]
    assert hessians[(name, "k")] is per_head and per_head.shape == (2, 128, 128)  # [Hk, K, K]
    # the same statistic from the layer's own inputs and an explicit softmax, query by query
    seen = {}
    hooks = [
        layer.self_attn.qkv_proj.register_forward_pre_hook(
            lambda m, a: seen.setdefault("x", []).append(a[0])
        ),
        layer.self_attn.attn.register_forward_pre_hook(lambda m, a: seen.setdefault("qk", []).append(a[:2])),
    ]
    for start in range(0, 200, 128):
        sequence_logprobs(llm, tokens[start : start + 128])
    for h in hooks:
        h.remove()
    expected = torch.zeros(2, 128, 128)
    for x, (q, k) in zip(seen["x"], seen["qk"], strict=True):
        t, group = x.shape[0], q.shape[1] // k.shape[1]
        for head in range(2):
            mass = torch.zeros(t)
            for qh in range(head * group, (head + 1) * group):
                for i in range(t):
                    mass[: i + 1] += torch.softmax(
                        k[: i + 1, head] @ q[i, qh] * layer.self_attn.attn.scale, 0
                    )
            expected[head] += (x * (mass / group)[:, None]).t() @ x
    assert torch.allclose(per_head, expected, rtol=1e-3, atol=1e-3 * expected.abs().max())
    # the down projection: plain and weighted statistics, each of trace 1, added
    assert hessians["model.layers.1.mlp.down_proj.weight"].trace().item() == pytest.approx(2.0, rel=1e-4)


def test_one_statistic_per_layer_when_per_head_ones_do_not_fit(tiny, tmp_path, monkeypatch):
    llm = LLM(tiny, weight_quant="none", enable_prefix_caching=False)
    tokens = torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(2)).tolist()
    per_head = collect_hessians(llm, tokens, window=128)
    averaged = collect_hessians(llm, tokens, window=128, per_kv_head=False)
    name = ("model.layers.0.self_attn.qkv_proj.weight", "v")
    assert averaged[name].shape == (1, 128, 128)
    assert torch.allclose(averaged[name][0], per_head[name].mean(0), rtol=1e-4, atol=1e-4)
    small, large = hessian_bytes(llm.model, per_kv_head=False), hessian_bytes(llm.model)
    assert large - small == 2 * (2 - 1) * 128 * 128 * 4  # two layers, Hk = 2 matrices instead of one
    import engine.quant.convert as convert_module
    import engine.quant.recipes as recipes

    calls = []
    real = recipes.gptq_quantize
    monkeypatch.setattr(recipes, "gptq_quantize", lambda w, h, *a: calls.append(h.shape) or real(w, h, *a))
    monkeypatch.setattr(convert_module, "MAX_HESSIAN_BYTES", small)  # per-head statistics no longer fit
    convert(tiny, tmp_path / "w4.ninfer", "w4g128", method="gptq")
    assert (1, 128, 128) in calls and (2, 128, 128) not in calls
    calls.clear()
    monkeypatch.setattr(convert_module, "MAX_HESSIAN_BYTES", small - 1)  # nothing fits: round-to-nearest
    convert(tiny, tmp_path / "rtn.ninfer", "w4g128", method="gptq")
    assert calls == []


def test_attention_mass_sums_to_the_query_count():
    q, k = torch.randn(7, 4, 16), torch.randn(7, 2, 16)
    mass = attention_mass(q, k, 0.25)
    assert mass.shape == (2, 7) and torch.allclose(mass.sum(-1), torch.full((2,), 7.0))
    assert (mass[:, 0] >= 1.0).all()  # every query sees the first key; the first sees only it


def test_row_blocks_use_their_own_statistics():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    hs = torch.stack([correlated_inputs(256, seed=s).t() @ correlated_inputs(256, seed=s) for s in (4, 5)])
    whole = gptq_quantize(w, hs, 4)
    halves = [gptq_quantize(w[:32], hs[0], 4), gptq_quantize(w[32:], hs[1], 4)]
    assert whole.shape == (64, 256)
    assert torch.equal(dequantize(whole), torch.cat([dequantize(h) for h in halves]))
    assert not torch.equal(dequantize(whole), dequantize(gptq_quantize(w, hs[0], 4)))


@pytest.mark.parametrize("bits", [4, 6])
def test_refit_lowers_the_output_error(bits, monkeypatch):
    w = torch.randn(96, 576, generator=torch.Generator().manual_seed(bits))
    x = correlated_inputs(576, seed=7)

    def output_error(qt):
        return (x @ (dequantize(qt) - w).t()).norm().item()

    refitted = gptq_quantize(w, x.t() @ x, bits)
    monkeypatch.setattr(gptq, "refit_grid", lambda w, h, codes, scales, minimums, group: (scales, minimums))
    walked = gptq_quantize(w, x.t() @ x, bits)
    assert torch.equal(unpack(refitted.packed, bits), unpack(walked.packed, bits))  # the codes stay
    assert output_error(refitted) < 0.99 * output_error(walked)


def test_convert_gptq_is_closer_to_the_source_than_rtn(tiny, tmp_path):
    tokens = torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(9)).tolist()
    base = sequence_logprobs(LLM(tiny, weight_quant="none", enable_prefix_caching=False), tokens)
    kl = {}
    for method in ("gptq", "rtn"):
        out = tmp_path / f"{method}.ninfer"
        convert(tiny, out, "w4g128", method=method)
        got = sequence_logprobs(LLM(out, weight_quant="none", enable_prefix_caching=False), tokens)
        kl[method] = torch.sum(base.exp() * (base - got), dim=-1).mean().item()
    assert kl["gptq"] < kl["rtn"]


def test_convert_hands_each_checkpoint_tensor_its_statistics(tiny, tmp_path, monkeypatch):
    import engine.quant.recipes as recipes

    calls = []  # (weight shape, H)
    real = recipes.gptq_quantize

    def recording(w, hessian, bits, group_size=128):
        calls.append((tuple(w.shape), hessian))
        return real(w, hessian, bits, group_size)

    monkeypatch.setattr(recipes, "gptq_quantize", recording)
    convert(tiny, tmp_path / "w4.ninfer", "w4g128", method="gptq")
    shapes = {(w, tuple(h.shape)) for w, h in calls}
    assert ((32, 128), (2, 128, 128)) in shapes  # k_proj / v_proj rows: one H per KV head
    assert ((64, 128), (128, 128)) in shapes  # q_proj: the plain statistics
    downs = [h for w, h in calls if w == (128, 256)]
    assert len(downs) == 2  # one per layer: plain + weighted, each of trace 1
    assert all(h.trace().item() == pytest.approx(2.0, rel=1e-4) for h in downs)


def test_unknown_method_is_refused(tiny, tmp_path):
    with pytest.raises(NinferError, match="unknown method 'awq'; use one of gptq, rtn"):
        convert(tiny, tmp_path / "m.ninfer", "w4g128", method="awq")


def test_a_tied_head_keys_its_statistics_by_the_embedding(tmp_path):
    """The table shared by the lookup and the head is quantized for the head's inputs."""
    path = save_tiny(
        tiny_hf_model("llama", tied=True, seed=6, hidden_size=128, intermediate_size=256), tmp_path / "src"
    )
    llm = LLM(path, weight_quant="none", enable_prefix_caching=False)
    tokens = torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    hessians = collect_hessians(llm, tokens, window=128)
    assert "model.embed_tokens.weight" in hessians and "lm_head.weight" not in hessians
    assert hessians["model.embed_tokens.weight"].shape == (128, 128)
