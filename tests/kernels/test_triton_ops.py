"""Every Triton kernel against its naive twin: on CUDA where there is one, else on CPU under
TRITON_INTERPRET=1 (tests/conftest.py sets it). RMS-relative error: <= 1e-3 in fp32, <= 1e-2 in bf16;
for quantized KV, against the naive twin on the same quantized cache."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import triton.language as tl
from paged_cases import paged_case

from engine.cache.kv_layout import KVCache
from ninfer_kernels.conv1d import naive as conv1d_naive
from ninfer_kernels.gated_delta import naive as gated_delta_naive
from ninfer_kernels.kv_store import naive as kv_store_naive
from ninfer_kernels.paged_attention import naive as attention_naive
from ninfer_kernels.race_noise import naive as race_noise_naive
from ninfer_kernels.rmsnorm import naive as rmsnorm_naive
from ninfer_kernels.rope import naive as rope_naive
from ninfer_kernels.silu_mul import naive as silu_mul_naive

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}
KV_DTYPES = ["fp32", "bf16", "fp16", "fp8", "int8", "k8v4"]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)  # each case draws the same data whatever ran before


def triton_op(op: str):
    return importlib.import_module(f"ninfer_kernels.{op}.triton")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,dim", [(1, 64), (7, 576), (33, 1000)])
@pytest.mark.parametrize("residual,zero_centered", [(False, False), (True, False), (True, True)])
def test_rmsnorm(dtype, rows, dim, residual, zero_centered):
    x, w = randn(rows, dim, dtype=dtype), randn(dim, dtype=dtype)
    r = randn(rows, dim, dtype=dtype) if residual else None
    got = triton_op("rmsnorm").rmsnorm(x, w, 1e-6, r, zero_centered)
    want = rmsnorm_naive.rmsnorm(x, w, 1e-6, r, zero_centered)
    if residual:
        assert rel_err(got[1], want[1]) < TOL[dtype]
        got, want = got[0], want[0]
    assert got.dtype == dtype and rel_err(got, want) < TOL[dtype]


@pytest.mark.parametrize("vocab", [1, 1000, 1025, 49152])
def test_race_noise(vocab):
    """The same uniforms as the twin (the noise to fp32 rounding of the log), for keys of every sign and both
    extremes; no noise of 0 (a U of 1) and none past -log(2^-24)."""
    keys = torch.tensor([0, 1, -1, 2**62 + 12345, -(2**63), 2**63 - 1, 987654321987], device=DEVICE)
    got = triton_op("race_noise").race_noise(keys, vocab)
    want = race_noise_naive.race_noise(keys, vocab)
    assert got.shape == (7, vocab) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert want.min() > 0 and want.max() <= 24 * math.log(2) + 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,dim", [(4, 48), (6, 128)])
def test_rmsnorm_gated(dtype, heads, dim):
    x, z, w = randn(5, heads, dim, dtype=dtype), randn(5, heads, dim, dtype=dtype), randn(dim, dtype=dtype)
    got = triton_op("rmsnorm").rmsnorm_gated(x, z, w, 1e-6)
    assert rel_err(got, rmsnorm_naive.rmsnorm_gated(x, z, w, 1e-6)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inter", [(1, 64), (9, 1536), (3, 4001)])
def test_silu_mul(dtype, rows, inter):
    x = randn(rows, 2 * inter, dtype=dtype)
    assert rel_err(triton_op("silu_mul").silu_mul(x), silu_mul_naive.silu_mul(x)) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "num_q_heads,num_kv_heads,head_dim,rotary_dim", [(4, 4, 64, 64), (8, 2, 128, 128), (6, 1, 256, 64)]
)
def test_rope(dtype, num_q_heads, num_kv_heads, head_dim, rotary_dim):
    tokens = 11
    # q and k as strided views of one fused qkv projection, as the models pass them
    qkv = randn(tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, dtype=dtype)
    q = qkv[:, : num_q_heads * head_dim].view(tokens, num_q_heads, head_dim)
    k = qkv[:, num_q_heads * head_dim : (num_q_heads + num_kv_heads) * head_dim].view(
        tokens, num_kv_heads, head_dim
    )
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(70000).float()[:, None] * inv_freq
    cache = torch.cat([freqs.cos(), freqs.sin()], -1).to(DEVICE)
    positions = torch.tensor([0, 1, 2, 7, 100, 5000, 3, 3, 65535, 12, 13], device=DEVICE)
    gq, gk = triton_op("rope").rope(q, k, positions, cache)
    wq, wk = rope_naive.rope(q, k, positions, cache)
    assert rel_err(gq, wq) < TOL[dtype] and rel_err(gk, wk) < TOL[dtype]


def _skip_fp8_under_interpreter(kv_dtype: str) -> None:
    if kv_dtype == "fp8" and DEVICE == "cpu":
        pytest.skip(
            "the Triton interpreter rounds fp32 -> fp8 e4m3 wrongly (7.9 -> 4.0); fp8 writes are checked on CUDA"
        )


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim,num_kv_heads", [(64, 1), (128, 2), (256, 3)])
def test_kv_store(kv_dtype, head_dim, num_kv_heads):
    _skip_fp8_under_interpreter(kv_dtype)
    num_blocks, block_size = 6, 16
    got = KVCache.allocate(kv_dtype, num_blocks, block_size, num_kv_heads, head_dim, DEVICE)
    want = KVCache.allocate(kv_dtype, num_blocks, block_size, num_kv_heads, head_dim, DEVICE)
    tokens = 13
    # a strided k/v (views of a fused projection), scattered slots, one padding token (-1)
    kv = randn(tokens, 2 * num_kv_heads * head_dim) * 3
    k = kv[:, : num_kv_heads * head_dim].view(tokens, num_kv_heads, head_dim)
    v = kv[:, num_kv_heads * head_dim :].view(tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:tokens]
    slots[4] = -1
    triton_op("kv_store").kv_store(k, v, got, slots)
    kv_store_naive.kv_store(k, v, want, slots)
    for name in ("k_data", "v_data", "k_scale", "v_scale"):
        a, b = getattr(got, name), getattr(want, name)
        if a is None:
            continue
        if a.dtype in (torch.int8, torch.uint8):  # quantized codes: equal but for rare rounding ties
            assert (a.int() - b.int()).abs().le(1).all() and (a != b).float().mean() < 1e-3, name
        else:
            assert rel_err(a, b) < (1e-2 if a.dtype == torch.bfloat16 else 1e-3), name


def _paged_case(kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, prefix, new, dtype):
    return paged_case(kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, prefix, new, dtype, DEVICE)


# head_dim x GQA ratio (1, 4, 6) x page size; every KV dtype; lengths not powers of two, pages crossed;
# key tiles of 4 to 16 pages, and of one (page size 64)
ATTN_SHAPES = [(64, 4, 4, 16), (128, 8, 2, 16), (256, 6, 1, 4), (128, 12, 2, 4), (128, 8, 2, 64)]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim,num_q_heads,num_kv_heads,block_size", ATTN_SHAPES)
@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_paged_attention(kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, step):
    if step == "prefill":  # a fresh prompt, a chunk after a cached prefix, and a decode row in one batch
        prefix, new = [0, 21, 45], [37, 19, 1]
    else:
        prefix, new = [0, 17, 70, 5], [1, 1, 1, 1]
    case = _paged_case(kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, prefix, new, torch.float32)
    scale = head_dim**-0.5
    got = triton_op("paged_attention").paged_attention(*case, scale)
    want = attention_naive.paged_attention(*case, scale)
    assert rel_err(got, want) < 1e-3


@pytest.mark.parametrize("kv_dtype", ["int8", "k8v4", "bf16"])
@pytest.mark.parametrize("head_dim,num_q_heads,num_kv_heads,block_size", ATTN_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_int8_queries(kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, dtype):
    """--int8-prefill over an int8 / k8v4 cache: the prefill kernel rounds each scaled query row to int8
    and multiplies it by the int8 K codes (integer products, exact), as the twin rounds it; a 16-bit cache
    ignores the flag. The rounding moves the output by ~0.5% of its size."""
    attention = triton_op("paged_attention")
    case = _paged_case(
        kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, [0, 21, 45], [37, 19, 1], dtype
    )
    scale = head_dim**-0.5
    got = attention.paged_attention(*case, scale, int8_queries=True)
    want = attention_naive.paged_attention(*case, scale, int8_queries=True)
    assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 1e-2)
    plain = attention_naive.paged_attention(*case, scale)
    if kv_dtype == "bf16":
        assert torch.equal(want, plain)
    else:
        assert 1e-4 < rel_err(want, plain) < 2e-2
        # uniform verification steps keep the decode kernel and 16-bit queries
        q, cache, table, lens, _ = _paged_case(
            kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, [9, 30], [2, 2], dtype
        )
        cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=q.device)
        if 2 * num_q_heads // num_kv_heads <= 32:
            got = attention.paged_attention(
                q, cache, table, lens, cu, scale, query_tokens_per_seq=2, int8_queries=True
            )
            assert torch.equal(
                attention_naive.paged_attention(q, cache, table, lens, cu, scale, int8_queries=True),
                attention_naive.paged_attention(q, cache, table, lens, cu, scale),
            )
            assert rel_err(got, attention_naive.paged_attention(q, cache, table, lens, cu, scale)) < (
                1e-3 if dtype == torch.float32 else 1e-2
            )


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "k8v4"])
def test_paged_attention_bf16_queries(kv_dtype):
    """bf16 models: on a GPU both products take bf16 operands (k8v4's V through the bf16 bit operations)."""
    attention = triton_op("paged_attention")
    case = _paged_case(kv_dtype, 128, 8, 2, 16, [3, 40], [29, 1], torch.bfloat16)
    got = attention.paged_attention(*case, 128**-0.5)
    assert got.dtype == torch.bfloat16
    assert rel_err(got, attention_naive.paged_attention(*case, 128**-0.5)) < 1e-2
    case = _paged_case(kv_dtype, 128, 8, 2, 16, [3, 40], [1, 1], torch.bfloat16)
    got = attention.paged_attention_decode(*case[:4], 128**-0.5)
    assert rel_err(got, attention_naive.paged_attention(*case, 128**-0.5)) < 1e-2


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU runs half-precision operands in the tests above")
@pytest.mark.parametrize("kv_dtype", ["fp16", "int8", "k8v4"])
@pytest.mark.parametrize("head_dim,num_q_heads,num_kv_heads,block_size", [(64, 4, 4, 16), (256, 6, 1, 4)])
def test_paged_attention_half_precision_operands(
    monkeypatch, kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size
):
    """On a GPU both products take the model's half dtype: int8 codes cast as they are (their scales applied
    to the scores and the probabilities), k8v4's int4 V turned into floats by bit operations
    (kernels/triton_codes.py). The interpreter computes fp16 faithfully (not bf16), so fp16 operands are
    forced on it here, prefill and decode."""
    attention = triton_op("paged_attention")
    monkeypatch.setattr(attention, "dot_dtype", lambda dtype: tl.float16)
    for prefix, new in (([0, 21, 45], [37, 19, 1]), ([0, 17, 70], [1, 1, 1])):
        case = _paged_case(
            kv_dtype, head_dim, num_q_heads, num_kv_heads, block_size, prefix, new, torch.float16
        )
        want = attention_naive.paged_attention(*case, head_dim**-0.5)
        got = attention.paged_attention(*case, head_dim**-0.5)
        assert rel_err(got, want) < 2e-3
        if max(new) == 1:
            assert rel_err(attention.paged_attention_decode(*case[:4], head_dim**-0.5), want) < 2e-3


def test_decode_kernel_serves_speculative_verification():
    """k + 1 = 4 query tokens per sequence through the split-K decode kernel equal the prefill path."""
    q, cache, table, seq_lens, cu = _paged_case("int8", 64, 8, 2, 16, [30, 9], [4, 4], torch.float32)
    attention = triton_op("paged_attention")
    got = attention.paged_attention_decode(q, cache, table, seq_lens, 0.125, q_per_seq=4)
    assert rel_err(got, attention_naive.paged_attention(q, cache, table, seq_lens, cu, 0.125)) < 1e-3


@pytest.mark.parametrize("per_seq, group, decode", [(4, 4, True), (5, 6, True), (9, 4, False), (0, 4, False)])
def test_verification_steps_take_the_decode_kernel_when_they_fit_its_tile(
    monkeypatch, per_seq, group, decode
):
    """A step with the same query count per sequence (a host int from the runner) goes to the split-K decode
    kernel while queries x GQA group fit MAX_VERIFY_ROWS; otherwise to the prefill kernel. Same result."""
    attention = triton_op("paged_attention")
    calls = []
    decode_kernel = attention.paged_attention_decode
    monkeypatch.setattr(
        attention, "paged_attention_decode", lambda *a, **kw: calls.append(a) or decode_kernel(*a, **kw)
    )
    q_len = per_seq or 3
    case = _paged_case("k8v4", 64, 2 * group, 2, 16, [30, 9], [q_len, q_len], torch.float32)
    got = attention.paged_attention(*case, 0.125, query_tokens_per_seq=per_seq)
    assert bool(calls) == decode
    assert rel_err(got, attention_naive.paged_attention(*case, 0.125)) < 1e-3


@pytest.mark.parametrize(
    "head_dim,kv_dtype,shared,keys",
    [
        (256, "bf16", 232448, 64),  # SM 9.0: three stages of the 64-key tile fit
        (256, "bf16", 101376, 32),  # SM 8.6 / 8.9: they would not
        (256, "k8v4", 232448, 64),
        (256, "fp32", 232448, 32),  # fp32 caches: twice the bytes a key
        (128, "bf16", 232448, 64),  # head_dim 128 takes 64 keys anyway
    ],
)
def test_decode_widens_its_key_tile_where_three_stages_fit(monkeypatch, head_dim, kv_dtype, shared, keys):
    import ninfer_kernels.triton_config as triton_config

    attention = triton_op("paged_attention")
    monkeypatch.setattr(triton_config, "shared_memory_per_block", lambda device: shared)
    q, cache, *_ = _paged_case(kv_dtype, head_dim, 6, 1, 16, [300], [1], torch.bfloat16)
    assert attention._decode_block_n(q, cache, 16) == keys
    # verification's 32 rows: 8- / 4-bit caches keep 32 keys (64 would spill registers dequantizing)
    assert attention._decode_block_n(q, cache, 32) == (keys if kv_dtype == "bf16" else 32)


@pytest.mark.parametrize(
    "head_dim, capability, shared, tokens, wide",
    [
        (256, 90, 232448, 2048, True),  # H100 / H200: three stages of 128 rows x 32 keys fit (~168 KB)
        (128, 90, 232448, 2048, True),
        (256, 90, 232448, 2047, False),  # a shorter step: the narrow tile's programs fill the SMs
        (256, 120, 101376, 2048, False),  # RTX 5090: 99 KB (the wide tile needs 104 KB even at two stages)
        (128, 120, 101376, 2048, False),
        (256, 86, 101376, 2048, False),  # before Hopper
    ],
)
def test_long_prefill_steps_widen_where_three_stages_fit(
    monkeypatch, head_dim, capability, shared, tokens, wide
):
    import ninfer_kernels.triton_config as triton_config

    attention = triton_op("paged_attention")
    monkeypatch.setattr(triton_config, "shared_memory_per_block", lambda device: shared)
    monkeypatch.setattr(attention, "compute_capability", lambda device: capability)
    q, cache, *_ = _paged_case("bf16", head_dim, 6, 1, 16, [0], [tokens], torch.bfloat16)
    assert attention._wide_prefill_tile(q, cache, attention._key_tile(cache, None)) == wide
    kv8 = _paged_case("int8", head_dim, 6, 1, 16, [0], [tokens], torch.bfloat16)[1]
    assert not attention._wide_prefill_tile(q, kv8, attention._key_tile(kv8, None))  # 16-bit caches only


@pytest.mark.gpu
def test_long_prefill_steps_take_the_wide_tile_on_hopper():
    """A step of WIDE_PREFILL_MIN_TOKENS+ query tokens over a bf16 cache on SM 9.0+: 128-row tiles, 8 warps
    (a fresh prompt and a chunk after a cached prefix in one step); the same attention as the twin."""
    attention = triton_op("paged_attention")
    case = _paged_case("bf16", 256, 6, 1, 16, [0, 300], [1500, 700], torch.bfloat16)
    wide = attention._wide_prefill_tile(case[0], case[1], attention._key_tile(case[1], None))
    assert wide == (torch.cuda.get_device_capability() >= (9, 0))
    got = attention.paged_attention(*case, 0.0625)
    assert rel_err(got, attention_naive.paged_attention(*case, 0.0625)) < 1e-2


def test_tuning_knobs_keep_the_result():
    """The sweep's split counts and prefill tiles (benchmarks/gpu_kernels.py) compute the same attention."""
    attention = triton_op("paged_attention")
    case = _paged_case("k8v4", 64, 8, 2, 16, [300, 7], [1, 1], torch.float32)
    want = attention_naive.paged_attention(*case, 0.125)
    for splits in (1, 5, 64):  # 64: more splits than 16-key tiles of the short sequence
        got = attention.paged_attention_decode(*case[:4], 0.125, num_splits=splits, num_warps=8)
        assert rel_err(got, want) < 1e-3
    # the SM 9.0 decode tile at head_dim 256 (64 keys a step, 4 pages), every KV dtype's loads, the last
    # tile of each split partly past the sequence
    for kv_dtype in ("bf16", "int8", "k8v4"):
        case = _paged_case(kv_dtype, 256, 6, 1, 16, [300, 70], [1, 1], torch.float32)
        want = attention_naive.paged_attention(*case, 0.0625)
        got = attention.paged_attention_decode(*case[:4], 0.0625, num_splits=3, block_n=64)
        assert rel_err(got, want) < 1e-3
    case = _paged_case("bf16", 64, 8, 2, 16, [40, 0], [50, 70], torch.float32)
    want = attention_naive.paged_attention(*case, 0.125)
    for block_m, block_n in ((64, 16), (16, 64), (128, 32)):  # (128, 32): the SM 9.0 tile of long steps
        got = attention.paged_attention(*case, 0.125, block_m=block_m, block_n=block_n, num_warps=8)
        assert rel_err(got, want) < 1e-3
    with pytest.raises(ValueError, match="block_n must be a power of two and a multiple of the page size 16"):
        attention.paged_attention(*case, 0.125, block_n=8)


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_paged_attention_int64_offsets(step, monkeypatch):
    """Caches of 2^31 elements or more take int64 offsets (smaller ones int32): the same attention."""
    attention = triton_op("paged_attention")
    monkeypatch.setattr(attention, "_wide_offsets", lambda cache: True)
    new = [1, 1] if step == "decode" else [9, 30]
    case = _paged_case("k8v4", 128, 8, 2, 16, [70, 33], new, torch.float32)
    want = attention_naive.paged_attention(*case, 0.125)
    assert rel_err(attention.paged_attention(*case, 0.125), want) < 1e-3


def test_decode_splits_grow_with_context():
    attention = triton_op("paged_attention")
    assert attention.num_decode_splits(512) == 1
    assert attention.num_decode_splits(32768) == 32
    assert attention.num_decode_splits(32768, "bf16") == attention.num_decode_splits(131072, "fp16") == 32
    # 8- / 4-bit caches: a split per 512 keys, up to 64
    assert attention.num_decode_splits(512, "int8") == 1 and attention.num_decode_splits(3000, "k8v4") == 6
    assert attention.num_decode_splits(32768, "fp8") == attention.num_decode_splits(131072, "int8") == 64
    # a long context split 32 ways still equals the reference
    case = _paged_case("fp16", 64, 4, 1, 16, [3000], [1], torch.float32)
    assert attention.num_decode_splits(case[2].shape[1] * 16) == 3
    assert (
        rel_err(attention.paged_attention(*case, 0.125), attention_naive.paged_attention(*case, 0.125)) < 1e-3
    )


# Gated DeltaNet ops (Qwen3.5's linear-attention layers). Sequences: decode (one token each); prefill chunks
# with an empty sequence and lengths past one token block; slot -1 = a padding row (zero out, no state).
GDN_LENGTHS = [[1, 1, 1], [5, 0, 37]]
GDN_SLOTS = [[4, 0, 2], [4, -1, 2]]


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels,kernel", [(300, 4), (40, 2), (130, 3)])  # one block of 128, a tail
@pytest.mark.parametrize("lengths", GDN_LENGTHS)
@pytest.mark.parametrize("slots", GDN_SLOTS)
def test_causal_conv1d(dtype, channels, kernel, lengths, slots):
    t = sum(lengths)
    x = randn(t, channels + 9, dtype=dtype)[:, 3 : 3 + channels]  # a view into in_proj's output, as the layer
    weight = randn(channels, kernel, dtype=dtype)
    state = randn(5, channels, kernel - 1, dtype=dtype)
    cu, idx = _cu(lengths), torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    want_state = state.clone()
    want = conv1d_naive.causal_conv1d(x, weight, want_state, cu, idx)
    got = triton_op("conv1d").causal_conv1d(x, weight, state, cu, idx)
    assert got.dtype == dtype and rel_err(got, want) < TOL[dtype]
    assert torch.equal(state, want_state)  # the last K - 1 inputs, copied; slot -1 and unused slots untouched
    if -1 in slots and lengths[1]:
        assert not got[cu[1] : cu[2]].any()


DELTA_SHAPES = [(2, 4, 128, 128), (3, 3, 64, 64), (1, 2, 32, 48), (2, 2, 20, 36)]
DELTA_LENGTHS = [*GDN_LENGTHS, [64, 1, 150]]  # 64, 150: whole and partial chunks of the chunked form
# the recurrent form (a token loop: slow under the interpreter past a few tokens) over every combination of
# the short lengths; the chunked form (its forward substitution a 63-step loop) over every shape and length
# with a padding row, bf16 on the Qwen3.5 shape
DELTA_CASES = [
    (dtype, shape, lengths, slots, False)
    for dtype in (torch.float32, torch.bfloat16)
    for shape in DELTA_SHAPES
    for lengths in GDN_LENGTHS
    for slots in GDN_SLOTS
] + [
    (dtype, shape, lengths, GDN_SLOTS[1], True)
    for dtype in (torch.float32, torch.bfloat16)
    for shape in DELTA_SHAPES
    for lengths in DELTA_LENGTHS
    if dtype == torch.float32 or shape == DELTA_SHAPES[0]
]


@pytest.mark.parametrize("dtype,shape,lengths,slots,chunked", DELTA_CASES)
def test_gated_delta_rule(dtype, shape, lengths, slots, chunked):
    hk, hv, dk, dv = shape
    t = sum(lengths)
    conv = randn(t, 2 * hk * dk + hv * dv + 3, dtype=dtype)  # q / k / v as views into one conv output
    q = conv[:, : hk * dk].view(t, hk, dk)
    k = conv[:, hk * dk : 2 * hk * dk].view(t, hk, dk)
    v = conv[:, 2 * hk * dk : 2 * hk * dk + hv * dv].view(t, hv, dv)
    g = -torch.rand(t, hv, device=DEVICE) * 0.5
    beta = torch.rand(t, hv, device=DEVICE).to(dtype)
    state = randn(5, hv, dk, dv) * 0.1
    cu, idx = _cu(lengths), torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    want_state = state.clone()
    want = gated_delta_naive.gated_delta_rule(q, k, v, g, beta, want_state, cu, idx)
    got = triton_op("gated_delta").gated_delta_rule(q, k, v, g, beta, state, cu, idx, chunked=chunked)
    assert got.dtype == dtype and rel_err(got, want) < TOL[dtype]
    # the fp32 state, every sequence's written back, the rest untouched; the chunked form's products take
    # bf16 operands on a GPU (emulated on CPU: ~3e-3 state error over 2K tokens)
    assert rel_err(state, want_state) < (TOL[dtype] if chunked else 1e-3)
    if -1 in slots and lengths[1]:
        assert not got[cu[1] : cu[2]].any()


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU runs half-precision operands in the test above")
def test_gated_delta_rule_chunked_half_precision_operands(monkeypatch):
    """On a GPU the chunked form's products take the model's half dtype (W and U stored in it, q, k and the
    deltas rounded to it, the state and the accumulation fp32). The interpreter computes fp16 faithfully,
    so fp16 operands are forced on it here: whole and partial chunks, a padding row, two value heads a key
    head."""
    gated_delta = triton_op("gated_delta")
    monkeypatch.setattr(gated_delta, "dot_dtype", lambda dtype: tl.float16)
    hk, hv, dk, dv = DELTA_SHAPES[0]
    lengths, slots = [150, 0, 70], [4, -1, 2]
    t = sum(lengths)
    q, k = randn(t, hk, dk, dtype=torch.float16), randn(t, hk, dk, dtype=torch.float16)
    v = randn(t, hv, dv, dtype=torch.float16)
    g, beta = -torch.rand(t, hv, device=DEVICE) * 0.5, torch.rand(t, hv, device=DEVICE).half()
    state = randn(5, hv, dk, dv) * 0.1
    cu, idx = _cu(lengths), torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    want_state = state.clone()
    want = gated_delta_naive.gated_delta_rule(q, k, v, g, beta, want_state, cu, idx)
    got = gated_delta.gated_delta_rule(q, k, v, g, beta, state, cu, idx, chunked=True)
    assert rel_err(got, want) < 5e-3 and rel_err(state, want_state) < 5e-3


def test_gated_delta_rule_picks_the_chunked_form_for_prefill(monkeypatch):
    gated_delta = triton_op("gated_delta")
    forms = []
    monkeypatch.setattr(gated_delta, "_chunked", lambda *a, **kw: forms.append("chunked") or a[-1])
    # half-precision inputs: on a GPU the chunked form needs them
    q, v = randn(40, 1, 16, dtype=torch.bfloat16), randn(40, 2, 16, dtype=torch.bfloat16)
    g, beta, state = -torch.rand(40, 2, device=DEVICE), torch.rand(40, 2, device=DEVICE), randn(3, 2, 16, 16)
    for lengths in ([1, 1, 38], [20, 20]):  # 13 tokens a sequence: recurrent; 20: chunked
        gated_delta.gated_delta_rule(q, q, v, g, beta, state, _cu(lengths), _cu(lengths)[1:] * 0)
    assert forms == ["chunked"]


def test_gated_delta_rule_without_l2norm():
    q, k, v = randn(9, 2, 32) * 0.1, randn(9, 2, 32) * 0.1, randn(9, 4, 32)
    g, beta, state = -torch.rand(9, 4, device=DEVICE), torch.rand(9, 4, device=DEVICE), randn(2, 4, 32, 32)
    cu, idx = _cu([4, 5]), torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    want_state = state.clone()
    want = gated_delta_naive.gated_delta_rule(q, k, v, g, beta, want_state, cu, idx, False)
    got = triton_op("gated_delta").gated_delta_rule(q, k, v, g, beta, state, cu, idx, False)
    assert rel_err(got, want) < 1e-3 and rel_err(state, want_state) < 1e-3


@pytest.mark.parametrize("block_v,num_warps", [(8, 1), (16, 2)])
def test_gated_delta_rule_tuning_knobs_keep_the_result(block_v, num_warps):
    q, k, v = randn(9, 2, 32), randn(9, 2, 32), randn(9, 4, 40)  # 40: a partial last value block
    g, beta, state = -torch.rand(9, 4, device=DEVICE), torch.rand(9, 4, device=DEVICE), randn(2, 4, 32, 40)
    cu, idx = _cu([4, 5]), torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)
    want_state = state.clone()
    want = gated_delta_naive.gated_delta_rule(q, k, v, g, beta, want_state, cu, idx)
    gated_delta = triton_op("gated_delta")
    got = gated_delta.gated_delta_rule(q, k, v, g, beta, state, cu, idx, block_v=block_v, num_warps=num_warps)
    assert rel_err(got, want) < 1e-3 and rel_err(state, want_state) < 1e-3


@pytest.mark.parametrize(
    "num_seqs, num_v_heads, head_v_dim, size, shared, expected",
    [
        (1, 48, 128, 2, 232448, 64),  # Qwen3.5-27B, one sequence: 192 narrow programs, 96 wide (one wave)
        (1, 32, 128, 2, 232448, 32),  # Qwen3.5-9B: 128 narrow programs, one wave already
        (2, 48, 128, 2, 232448, 32),  # two sequences: 192 wide programs, past one wave either way
        (1, 48, 128, 4, 232448, 32),  # fp32 operands: three wide stages do not fit
        (1, 48, 128, 2, 101376, 32),  # a 99 KB consumer GPU: nor there
        (1, 48, 16, 2, 232448, 16),  # 16 value dims: nothing wider to take
    ],
)
def test_the_scan_takes_64_value_dims_where_the_narrow_grid_is_past_one_wave(
    monkeypatch, num_seqs, num_v_heads, head_v_dim, size, shared, expected
):
    from ninfer_kernels.gated_delta import triton as gdt

    monkeypatch.setattr(gdt, "sm_count", lambda device: 132)  # an H200
    monkeypatch.setattr(gdt, "pipeline_stages", lambda need, device: 3 if need <= shared else 2)
    assert gdt._scan_block_v(num_seqs, num_v_heads, head_v_dim, 128, size, torch.device("cpu")) == expected
