"""CPU weight-only quantization: kernels against their dequantized weights, GGUF precision kept by `auto`,
and a tiny model's outputs with quantized weights close to dense."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

import engine.quant.cpu as cpu_quant
from engine import LLM, NinferError, SamplingParams
from engine.layers.linear import Linear
from engine.quant.cpu import INT4_GROUP, CpuInt4Weight, CpuInt8Weight, mode_for_bits


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def q4_1_blocks(n: int, k: int) -> torch.Tensor:
    """Weights as a GGUF Q4_1 file holds them: per 32-block, w = q * d + m with q in 0..15 (both ends used)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (n, k // INT4_GROUP, INT4_GROUP), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    d = torch.rand(n, k // INT4_GROUP, 1, generator=g) * 0.02 + 0.001
    m = -torch.rand(n, k // INT4_GROUP, 1, generator=g) * 0.1
    return (q * d + m).reshape(n, k)


@pytest.fixture(params=["native", "torch"])
def int4_kernel(request, monkeypatch):
    """CpuInt4Weight on the native kernel (where built) and on torch's int4 kernel."""
    if request.param == "native" and not cpu_quant.q4_cpu.available():
        pytest.skip(
            "the native int4 kernel is not built here (no compiler, or neither AVX-512 VNNI nor AVX2)"
        )
    if request.param == "torch":
        monkeypatch.setattr(cpu_quant.q4_cpu, "available", lambda: False)
    return request.param


@pytest.mark.parametrize("m", [1, 5, 64, 512])  # decode rows, a few, prefill chunks
@pytest.mark.parametrize("bf16_gemm", [True, False])  # prefill chunks: a bf16 GEMM, or fp32 without one
def test_int4_keeps_q4_1_blocks(int4_kernel, m, bf16_gemm, monkeypatch):
    monkeypatch.setattr(cpu_quant, "BF16_GEMM", bf16_gemm)
    w = q4_1_blocks(96, 128)
    packed = CpuInt4Weight(w)
    assert (packed.native is not None) == (int4_kernel == "native")
    # scales rounded to fp16 (native) or bf16 (torch); activations to two int8 terms (native) or to bf16
    # (torch's kernel, and the dense GEMM of long prefill chunks)
    native_rows = int4_kernel == "native" and m < packed.dense_min_rows
    assert rel_err(packed.dequantize(), w) < (1e-3 if int4_kernel == "native" else 4e-3)
    x = torch.randn(m, 128)
    assert rel_err(packed(x), x @ w.t()) < (1e-3 if native_rows else 1e-2)


@pytest.mark.skipif(not cpu_quant.q4_cpu.available(), reason="the native int4 kernel is not built here")
def test_int4_native_needs_fp16_scales():
    tiny = q4_1_blocks(32, 64) * 1e-4  # scales below fp16's normal range: torch's kernel instead
    packed = CpuInt4Weight(tiny)
    assert packed.native is None and packed.qweight is not None
    x = torch.randn(1, 64)
    assert rel_err(packed(x), x @ tiny.t()) < 1e-2


@pytest.mark.parametrize("n", [128, 96])  # 96: a tail of 32 rows, packed otherwise: the codes are kept
def test_int4_prefill_reads_the_kernels_own_packing(n, monkeypatch):
    monkeypatch.setattr(cpu_quant.q4_cpu, "available", lambda: False)  # torch's packing
    w = q4_1_blocks(n, 256)
    packed = CpuInt4Weight(w)
    if cpu_quant.packing_known():
        assert (packed.codes is None) == (n % cpu_quant.PACK_BLOCK_N == 0)  # one copy of the codes
    monkeypatch.setattr(cpu_quant, "_PACKING_KNOWN", False)
    kept = CpuInt4Weight(w)
    assert kept.codes is not None
    assert torch.equal(packed.dequantize(), kept.dequantize())
    x = torch.randn(cpu_quant.DENSE_MIN_ROWS, 256)  # prefill rows: the dense path
    assert torch.equal(packed(x), kept(x)) and rel_err(packed(x), x @ w.t()) < 1e-2


def test_int4_packing_probe_reads_back_random_codes():
    q = torch.randint(0, 16, (192, 96), dtype=torch.int32, generator=torch.Generator().manual_seed(4))
    if not cpu_quant.packing_known():
        pytest.skip("this torch build packs int4 differently: the codes are kept twice instead")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    assert torch.equal(cpu_quant.unpack_int4pack(packed, 192, 96).to(torch.int32), q)


@pytest.fixture(params=["fbgemm", "int_mm"])
def int8_kernel(request, monkeypatch):
    """CpuInt8Weight on fbgemm's prepacked matmul (where this torch has it) and on the `_int_mm` fallback."""
    if request.param == "fbgemm" and not cpu_quant.FBGEMM:
        pytest.skip("this torch build has no fbgemm")
    monkeypatch.setattr(cpu_quant, "FBGEMM", request.param == "fbgemm")
    return request.param


@pytest.mark.parametrize("m", [1, 8])
def test_int8_matmul_matches_its_dequantized_weight(m, int8_kernel):
    w = torch.randn(200, 64)
    packed = CpuInt8Weight(w)
    assert rel_err(packed.dequantize(), w) < 1e-2
    x = torch.randn(m, 64)
    assert rel_err(packed(x), x @ packed.dequantize().t()) < 1.5e-2  # int8 activations per token


def test_int8_rows_keep_their_precision_beside_a_large_row(int8_kernel):
    """A prompt's first token can be 1000x larger than the rest; the others keep their own precision."""
    w = torch.randn(300, 128)
    packed = CpuInt8Weight(w)
    x = torch.randn(6, 128)
    x[0] *= 1000.0
    want = x @ packed.dequantize().t()
    got = packed(x)
    for row in range(6):
        assert rel_err(got[row], want[row]) < 1e-3, row


def test_mode_for_bits():
    assert [mode_for_bits(b) for b in (None, 4, 5, 6, 8, 16)] == [
        "none",
        "int4",
        "int8",
        "int8",
        "int8",
        "none",
    ]


def test_auto_keeps_the_gguf_precision():
    llm = LLM(max_concurrency=1)
    layer = llm.model.model.layers[0]
    assert isinstance(layer.mlp.gate_up_proj.qweight, CpuInt4Weight)  # Q4_1
    assert isinstance(llm.model.lm_head.qweight, CpuInt8Weight)  # tied to the Q8_0 embedding
    assert llm.model.lm_head.weight is None
    assert llm.model.model.embed_tokens.weight.dtype == torch.float32  # the lookup table stays float
    dense = LLM(max_concurrency=1, weight_quant="none")
    assert all(m.qweight is None for m in dense.model.modules() if isinstance(m, Linear))


@pytest.mark.parametrize("mode,bound", [("int8", 0.25)])  # measured 0.12
def test_tiny_model_quantized_logprobs_close_to_dense(tmp_path, mode, bound):
    """Teacher-forced logprob deviation on the dense greedy path. int4 is checked on the real embedded
    model (tests/e2e): round-to-nearest int4 of this random tiny model's float weights moves logprobs
    by ~2 nats, which says nothing about a 4-bit checkpoint run as int4."""
    path = save_tiny(tiny_hf_model("qwen3", tied=False, seed=4), tmp_path)
    dense, quant = LLM(path, weight_quant="none"), LLM(path, weight_quant=mode)
    prompt = list(range(10, 60))
    ref = dense.generate(
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=0),
    )[0]
    worst = 0.0
    for k, token in enumerate(ref.token_ids):
        out = quant.generate(
            prompt_token_ids=prompt + ref.token_ids[:k],
            sampling_params=SamplingParams(max_tokens=1, temperature=0.0, logprobs=20),
        )[0]
        assert token in out.logprobs[0]
        worst = max(worst, abs(out.logprobs[0][token] - ref.logprobs[k][token]))
    assert worst < bound


def test_weight_quant_refusals():
    with pytest.raises(NinferError, match="unknown weight_quant 'int3'"):
        LLM(weight_quant="int3")


def test_a_gguf_s_4_bit_blocks_load_code_for_code():
    """On the CPU the embedded GGUF's Q4_1 matrices become the int4 kernel's weights as stored (no
    dequantize and quantize again): every layer's weight is the GGUF's own values, Llama's q / k rows
    moved back in place, fused shards in their rows; the Q8_0 table is quantized from its values."""
    from engine.models.loader import default_model_path, open_source

    dense = dict(open_source(default_model_path()).weights())
    llm = LLM(max_context=256)
    model, compared = llm.model, set()
    for ckpt, want in dense.items():
        mapped = model.param_for(ckpt)
        if mapped is None or not mapped[0].endswith(".weight"):
            continue
        module = model.get_submodule(mapped[0].removesuffix(".weight"))
        if not isinstance(getattr(module, "qweight", None), CpuInt4Weight):
            continue
        start, size = module.offsets[mapped[1]] if mapped[1] else (0, module.out_features)
        got = module.qweight.dequantize()[start : start + size]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        compared.add(ckpt)
    assert len(compared) == 7 * llm.model_config.num_hidden_layers  # q, k, v, o, gate, up, down


def test_a_q4_0_block_s_negative_scale_is_kept(int4_kernel):
    """Q4_0 stores w = d (q - 8) with d of either sign: the codes go in as they are, on either kernel."""
    q = torch.randint(0, 16, (32, 64), generator=torch.Generator().manual_seed(1))
    d = torch.tensor([-0.01, 0.02]).half().float().repeat(32, 1)  # [N, K / 32], as fp16 holds it
    w = CpuInt4Weight.from_codes(q.to(torch.uint8), d, -8 * d)
    want = (q.float() - 8).view(32, 2, 32) * d[..., None]
    # torch's kernel holds its scales in bf16 (the native one: fp16, as the file)
    exact = dict(rtol=0, atol=1e-6) if int4_kernel == "native" else dict(rtol=8e-3, atol=1e-6)
    torch.testing.assert_close(w.dequantize(), want.view(32, 64), **exact)
    x = torch.randn(3, 64)
    torch.testing.assert_close(w(x), x @ want.view(32, 64).t(), rtol=1e-2, atol=1e-2)
