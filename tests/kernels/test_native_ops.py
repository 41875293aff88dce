"""The CPU ops in C (kernels/<op>/native.c) against their naive twins, RMS-relative error <= 1e-5 (both in
fp32; the C ops sum in another order and take e^x from a polynomial), plus the build's fallbacks and the
dispatch. The int4 matmul is checked against its own twin (same int8 activations) and the dense weight."""

from __future__ import annotations

import pytest
import torch
from paged_cases import paged_case

import ninfer_kernels as kernels
import ninfer_kernels.q4_cpu as q4
from engine.cache.kv_layout import KVCache
from ninfer_kernels import native_build
from ninfer_kernels.conv1d import naive as conv1d_naive
from ninfer_kernels.conv1d import native as conv1d_native
from ninfer_kernels.gated_delta import naive as gated_delta_naive
from ninfer_kernels.gated_delta import native as gated_delta_native
from ninfer_kernels.kv_store import naive as kv_store_naive
from ninfer_kernels.kv_store import native as kv_store_native
from ninfer_kernels.paged_attention import naive as attention_naive
from ninfer_kernels.paged_attention import native as attention_native
from ninfer_kernels.q4_cpu import naive as q4_naive
from ninfer_kernels.race_noise import naive as race_noise_naive
from ninfer_kernels.race_noise import native as race_noise_native
from ninfer_kernels.rmsnorm import naive as rmsnorm_naive
from ninfer_kernels.rmsnorm import native as rmsnorm_native
from ninfer_kernels.rope import naive as rope_naive
from ninfer_kernels.rope import native as rope_native
from ninfer_kernels.silu_mul import naive as silu_mul_naive
from ninfer_kernels.silu_mul import native as silu_mul_native

TOL = 1e-5

pytestmark = pytest.mark.skipif(
    native_build.library() is None,
    reason=f"native CPU kernels unavailable: {native_build.unavailable_reason()}",
)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 64), (3, 100)])  # 100: a tail past 16 lanes
@pytest.mark.parametrize("residual,zero_centered", [(False, False), (True, False), (True, True)])
def test_rmsnorm(rows, dim, residual, zero_centered):
    x = torch.randn(rows, dim + 5)[:, :dim]  # rows with a stride, as a slice of a wider tensor
    w, r = torch.randn(dim), torch.randn(rows, dim) if residual else None
    got = rmsnorm_native.rmsnorm(x, w, 1e-6, r, zero_centered)
    want = rmsnorm_naive.rmsnorm(x, w, 1e-6, r, zero_centered)
    if residual:
        assert torch.equal(got[1], want[1])
        got, want = got[0], want[0]
    assert rel_err(got, want) < TOL


@pytest.mark.parametrize("heads,dim", [(16, 128), (3, 100)])
def test_rmsnorm_gated(heads, dim):
    x = torch.randn(5, heads, dim)
    proj = torch.randn(5, heads * dim + 7)  # the gate as a view into the input projection's output
    gate = proj[:, 3 : 3 + heads * dim].view(5, heads, dim)
    w = torch.randn(dim)
    want = rmsnorm_naive.rmsnorm_gated(x, gate, w, 1e-6)
    assert rel_err(rmsnorm_native.rmsnorm_gated(x, gate, w, 1e-6), want) < TOL
    assert rmsnorm_native.rmsnorm_gated(x.bfloat16(), gate, w, 1e-6) is None


def test_rmsnorm_per_head_and_refusals():
    x, w = torch.randn(5, 4, 64), torch.randn(64)  # q/k norm of Qwen3: [T, H, D]
    assert rel_err(rmsnorm_native.rmsnorm(x, w, 1e-6), rmsnorm_naive.rmsnorm(x, w, 1e-6)) < TOL
    assert rmsnorm_native.rmsnorm(x.bfloat16(), w, 1e-6) is None  # fp32 only: the caller runs the twin
    assert rmsnorm_native.rmsnorm(x.transpose(0, 1), w, 1e-6) is None  # not row-contiguous
    assert rmsnorm_native.rmsnorm(x, w[:32], 1e-6) is None  # a weight of another width: the twin says so


@pytest.mark.parametrize("vocab", [1, 1000, 49152])
def test_race_noise(vocab):
    """The twin's uniforms (the hash's integers), for keys of both signs and both extremes."""
    keys = torch.tensor([0, 1, -1, 2**62 + 12345, -(2**63), 2**63 - 1])
    got, want = race_noise_native.race_noise(keys, vocab), race_noise_naive.race_noise(keys, vocab)
    torch.testing.assert_close(torch.exp(-got), torch.exp(-want), rtol=1e-6, atol=0)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert race_noise_native.race_noise(keys.int(), vocab) is None  # int64 keys only: the twin runs


@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 37)])
def test_silu_mul(rows, inter):
    x = torch.randn(rows, 2 * inter + 3)[:, : 2 * inter] * 6  # exp over a wide range, strided rows
    assert rel_err(silu_mul_native.silu_mul(x), silu_mul_naive.silu_mul(x)) < TOL
    extreme = torch.tensor([[-200.0, -30.0, 0.0, 30.0, 200.0, 1.0, 2.0, 3.0, 4.0, 5.0]])
    assert rel_err(silu_mul_native.silu_mul(extreme), silu_mul_naive.silu_mul(extreme)) < TOL


@pytest.mark.parametrize("tokens", [1, 3, 20])  # 20: past the naive twin's rotation-matrix path
@pytest.mark.parametrize(
    "num_q,num_kv,head_dim,rotary_dim", [(9, 3, 64, 64), (8, 2, 128, 32), (4, 4, 256, 256)]
)
def test_rope(tokens, num_q, num_kv, head_dim, rotary_dim):
    qkv = torch.randn(tokens, (num_q + 2 * num_kv) * head_dim)
    q = qkv[:, : num_q * head_dim].view(tokens, num_q, head_dim)
    k = qkv[:, num_q * head_dim : (num_q + num_kv) * head_dim].view(tokens, num_kv, head_dim)
    positions = torch.randint(0, 4000, (tokens,))
    freqs = torch.arange(4096.0)[:, None] * (10000.0 ** (-torch.arange(0, rotary_dim, 2) / rotary_dim))[None]
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    got, want = rope_native.rope(q, k, positions, cache), rope_naive.rope(q, k, positions, cache)
    assert rel_err(got[0], want[0]) < TOL and rel_err(got[1], want[1]) < TOL
    with pytest.raises(ValueError, match="out of range"):
        rope_native.rope(q, k, torch.full((tokens,), 4096), cache)


def _caches(kv_dtype):
    return [KVCache.allocate(kv_dtype, 4, 16, 2, 64, "cpu") for _ in range(2)]


def _cache_tensors(cache):
    return [t for t in (cache.k_data, cache.v_data, cache.k_scale, cache.v_scale) if t is not None]


@pytest.mark.parametrize("kv_dtype", ["fp32", "bf16", "fp16", "int8", "k8v4"])
def test_kv_store_gives_the_twins_bits(kv_dtype):
    qkv = torch.randn(7, (4 + 2 * 2) * 64) * 3
    k, v = (qkv[:, a : a + 128].view(7, 2, 64) for a in (256, 384))
    k[4], v[4] = 0.0, 0.0  # an all-zero row: the scale clamps to fp16's smallest normal
    k[5, 0, :2] = torch.tensor([1e-6, 7e4])  # fp16 subnormal and overflow; scales then large
    v[6, 1] = torch.arange(64) * 0.5 - 16  # codes on rounding halves
    slots = torch.tensor([3, -1, 17, 40, 41, 8, 63])
    got, want = _caches(kv_dtype)
    assert kv_store_native.kv_store(k, v, got, slots)
    kv_store_naive.kv_store(k, v, want, slots)
    for a, b in zip(_cache_tensors(got), _cache_tensors(want)):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # bits, so NaN-free ties count too


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16"])
def test_kv_store_rounds_across_the_whole_range(kv_dtype):
    """C's own float -> half / bfloat16 rounding against torch's over 2^-30 .. 2^17, both signs."""
    x = torch.randn(64 * 64).sign() * 2.0 ** (torch.rand(64 * 64) * 47 - 30)
    x[:3] = torch.tensor([65519.0, 65520.0, 2.0**-25])  # the largest half, the first to round to inf, a tie
    k = x.view(64, 1, 64)
    got, want = (KVCache.allocate(kv_dtype, 4, 16, 1, 64, "cpu") for _ in range(2))
    assert kv_store_native.kv_store(k, k, got, torch.arange(64))
    kv_store_naive.kv_store(k, k, want, torch.arange(64))
    assert torch.equal(got.k_data.view(torch.int16), want.k_data.view(torch.int16))


def test_kv_store_refuses_a_slot_past_the_cache():
    qkv = torch.randn(6, (4 + 2 * 2) * 64)
    k, v = (qkv[:, a : a + 128].view(6, 2, 64) for a in (256, 384))
    got, _ = _caches("int8")
    before = [t.clone() for t in _cache_tensors(got)]
    with pytest.raises(ValueError, match="out of range"):
        kv_store_native.kv_store(k, v, got, torch.tensor([0, 1, 2, 3, 4, 64]))
    assert all(torch.equal(a, b) for a, b in zip(_cache_tensors(got), before))  # nothing written


# head_dim (48: the plain C path) x GQA ratio 1 / 3 / 4 / 6 x page size; lengths cross pages
ATTN_SHAPES = [(64, 9, 3, 16), (128, 8, 2, 16), (256, 6, 1, 4), (64, 4, 4, 4), (48, 6, 2, 16)]


@pytest.mark.parametrize("head_dim,num_q,num_kv,block_size", ATTN_SHAPES)
@pytest.mark.parametrize("new", [[1, 1, 1, 1], [1, 4, 2, 1]])  # decode; speculative verification rows
def test_paged_attention(head_dim, num_q, num_kv, block_size, new):
    case = paged_case("fp32", head_dim, num_q, num_kv, block_size, [0, 17, 70, 5], new, torch.float32, "cpu")
    got = attention_native.paged_attention(*case, head_dim**-0.5)
    assert rel_err(got, attention_naive.paged_attention(*case, head_dim**-0.5)) < TOL


@pytest.mark.parametrize("block_size", [16, 4, 48])  # 48: parts of 240 keys, not 256
@pytest.mark.parametrize("new", [[1, 1, 1, 1], [1, 4, 2, 3]])
def test_paged_attention_splits_long_sequences(block_size, new):
    """Past 256 keys a sequence runs in parts merged at the end; verification rows end on either side of
    a part boundary (254 + 4: rows see 255 .. 258 keys)."""
    case = paged_case("fp32", 64, 9, 3, block_size, [600, 254, 0, 1100], new, torch.float32, "cpu")
    got = attention_native.paged_attention(*case, 0.125)
    assert rel_err(got, attention_naive.paged_attention(*case, 0.125)) < TOL
    q, cache, table, seq_lens, cu = case
    for b in range(4):  # each sequence alone gives the same bits as in the batch
        rows = slice(cu[b].item(), cu[b + 1].item())
        alone = attention_native.paged_attention(
            q[rows], cache, table[b : b + 1], seq_lens[b : b + 1], cu[b : b + 2] - cu[b], 0.125
        )
        assert torch.equal(alone, got[rows])


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16", "int8", "k8v4"])
@pytest.mark.parametrize("head_dim,num_q,num_kv,block_size", [(64, 9, 3, 16), (128, 8, 2, 4), (96, 6, 1, 16)])
@pytest.mark.parametrize("new", [[1, 1, 1], [1, 4, 2]])
def test_paged_attention_reads_every_kv_dtype(kv_dtype, head_dim, num_q, num_kv, block_size, new):
    """Against the naive twin on the same quantized cache (both dequantize to the same fp32 values); 96:
    the plain C dot products; 300 keys: two parts."""
    case = paged_case(kv_dtype, head_dim, num_q, num_kv, block_size, [20, 300, 3], new, torch.float32, "cpu")
    got = attention_native.paged_attention(*case, head_dim**-0.5)
    assert rel_err(got, attention_naive.paged_attention(*case, head_dim**-0.5)) < TOL


def test_paged_attention_leaves_prefill_to_the_twin():
    prefill = paged_case("fp32", 64, 4, 2, 16, [0, 3], [40, 1], torch.float32, "cpu")
    assert attention_native.paged_attention(*prefill, 0.125) is None


def test_paged_attention_refuses_a_page_outside_the_cache():
    q, cache, table, seq_lens, cu = paged_case("fp32", 64, 4, 2, 16, [20], [1], torch.float32, "cpu")
    bad_table = table.clone()
    bad_table[0, 0] = cache.k_data.shape[0]
    with pytest.raises(ValueError, match="out of range"):
        attention_native.paged_attention(q, cache, bad_table, seq_lens, cu, 0.125)
    with pytest.raises(ValueError, match="out of range"):  # query rows past q
        attention_native.paged_attention(q, cache, table, seq_lens + 1, cu + 1, 0.125)
    assert attention_native.paged_attention(q[:, :, :32], cache, table, seq_lens, cu, 0.125) is None


def _q4_weight(n: int, k: int):
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scale, lo = torch.rand(n, k // q4.GROUP) * 0.02 + 0.001, -torch.rand(n, k // q4.GROUP) * 0.1
    return codes, scale, lo


def test_q4_pack_round_trip():
    codes, scale, lo = _q4_weight(48, 96)
    back = q4.unpack(q4.pack(codes, scale, lo), 48, 96)
    assert torch.equal(back[0], codes)
    assert torch.equal(back[1], scale.half().float()) and torch.equal(back[2], lo.half().float())


@pytest.mark.skipif(not q4.available(), reason="this CPU has neither AVX-512 VNNI nor AVX2")
@pytest.mark.parametrize("m", [1, 3, 5, 8, 9, 17])  # row tiles of 8 and their remainders
@pytest.mark.parametrize("n,k", [(16, 32), (960, 576), (48, 1536)])
def test_q4_matmul(m, n, k):
    codes, scale, lo = _q4_weight(n, k)
    packed = q4.pack(codes, scale, lo)
    x = torch.randn(m, k)
    x[0, :32] *= 1000.0  # one group far larger than the rest keeps the others' precision
    got = q4.matmul(x, packed, n)
    assert rel_err(got, q4_naive.q4_matmul(x, packed, n)) < TOL
    c, s, z = q4.unpack(packed, n, k)
    dense = (c.float().view(n, -1, q4.GROUP) * s[..., None] + z[..., None]).view(n, k)
    assert rel_err(got, x @ dense.t()) < 2e-4  # ~15-bit activations: two int8 terms per group


@pytest.mark.skipif(not q4.available(), reason="this CPU has neither AVX-512 VNNI nor AVX2")
def test_q4_matmul_gives_a_row_the_same_bits_alone_or_in_a_batch():
    """A sequence decodes to the same values whatever else is in the step (what seeded sampling of `n`
    choices, each as a request of its own would sample, rests on)."""
    packed = q4.pack(*_q4_weight(960, 576))
    x = torch.randn(11, 576)
    batch = q4.matmul(x, packed, 960)
    for i in range(11):
        assert torch.equal(batch[i], q4.matmul(x[i : i + 1], packed, 960)[0])


@pytest.mark.parametrize("n,k", [(16, 32), (960, 576), (48, 1536)])
@pytest.mark.parametrize("native", [True, False])
def test_q4_dequantize_t_bf16_gives_torchs_bits(n, k, native, monkeypatch):
    if not native:
        monkeypatch.setattr(q4, "has_q4", lambda: False)
    elif not q4.available():
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2")
    codes, scale, lo = _q4_weight(n, k)
    lo[0, 0] = 3e-6  # an fp16 subnormal minimum
    packed = q4.pack(codes, scale, lo)
    c, s, z = q4.unpack(packed, n, k)
    want = (c.float().view(n, -1, q4.GROUP) * s[..., None] + z[..., None]).view(n, k).to(torch.bfloat16)
    got = q4.dequantize_t_bf16(packed, n, k)
    assert got.shape == (k, n) and got.dtype == torch.bfloat16
    assert torch.equal(got.t(), want)


@pytest.mark.skipif(not q4.available(), reason="this CPU has neither AVX-512 VNNI nor AVX2")
def test_q4_matmul_from_two_threads_at_once():
    """The pool takes one job at a time; a second engine thread computes its own alone."""
    from concurrent.futures import ThreadPoolExecutor

    packed = q4.pack(*_q4_weight(960, 576))
    xs = [torch.randn(8, 576) for _ in range(2)]
    want = [q4.matmul(x, packed, 960) for x in xs]
    with ThreadPoolExecutor(2) as pool:  # ctypes releases the GIL: the calls overlap
        for _ in range(50):
            got = list(pool.map(lambda x: q4.matmul(x, packed, 960), xs))
            assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_pool_is_torchs_openmp_team_where_torch_runs_libgomp():
    lib = native_build.library()
    if native_build._openmp_parallel() is None or torch.get_num_threads() < 2:
        pytest.skip("torch does not run a libgomp team of two threads or more here")
    assert native_build.pool() == "openmp"
    with pytest.raises(ValueError, match="NINFER_CPU_POOL=threads is not one of openmp, helper"):
        native_build.set_pool(lib, "threads")


@pytest.mark.skipif(not q4.available(), reason="this CPU has neither AVX-512 VNNI nor AVX2")
def test_both_pools_give_the_same_bits(tmp_path, monkeypatch):
    """The pool only splits output blocks and sequences between threads: the arithmetic of each is the same."""
    import ctypes
    import shutil

    packed = q4.pack(*_q4_weight(960, 576))
    x = torch.randn(8, 576)
    case = paged_case("fp32", 64, 4, 2, 16, [30, 0, 700, 5, 200, 1, 9, 40], [1] * 8, torch.float32, "cpu")
    want = q4.matmul(x, packed, 960), attention_native.paged_attention(*case, 0.125)
    for pool in native_build.POOLS:
        copy = tmp_path / f"{pool}.so"  # a second copy loads apart from the first, with a pool of its own
        shutil.copy(native_build.library()._name, copy)
        lib = native_build.bind(ctypes.CDLL(str(copy)))
        native_build.set_pool(lib, pool)
        monkeypatch.setitem(native_build._state, "lib", lib)
        for _ in range(20):
            assert torch.equal(q4.matmul(x, packed, 960), want[0])
            assert torch.equal(attention_native.paged_attention(*case, 0.125), want[1])


@pytest.mark.skipif(not q4.available(), reason="this CPU has neither AVX-512 VNNI nor AVX2")
def test_q4_matmul_refuses_a_weight_of_another_shape():
    packed = q4.pack(*_q4_weight(32, 64))
    with pytest.raises(ValueError, match=r"packed as \(2, 2, 320\) is not \[32, 96\]"):
        q4.matmul(torch.randn(2, 96), packed, 32)
    assert q4.matmul(torch.randn(2, 64, dtype=torch.bfloat16), packed, 32).dtype == torch.float32


def test_q4_supports_only_what_fp16_scales_hold():
    codes, scale, lo = _q4_weight(32, 64)
    assert q4.supports(32, 64, scale, lo)
    assert not q4.supports(24, 64, scale, lo)  # rows not a multiple of 16
    assert not q4.supports(32, 64, scale * 1e-3, lo)  # below fp16's normal range
    assert not q4.supports(32, 64, scale, lo * 1e7)


def test_dispatch_runs_the_native_op_unless_naive_is_forced(monkeypatch):
    calls = []
    real = rmsnorm_native.rmsnorm
    monkeypatch.setattr(rmsnorm_native, "rmsnorm", lambda *a: calls.append(1) or real(*a))
    x, w = torch.randn(2, 64), torch.randn(64)
    kernels.rmsnorm(x, w, 1e-6)
    assert calls == [1]
    kernels.force_backend("naive")
    try:
        kernels.rmsnorm(x, w, 1e-6)
    finally:
        kernels.force_backend("")
    assert calls == [1]
    assert kernels.rmsnorm(x.bfloat16(), w.bfloat16(), 1e-6).dtype == torch.bfloat16  # refused: the twin


def test_build_fallbacks_say_why(monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "_state", {})
    monkeypatch.setenv("NINFER_CPU_KERNELS", "torch")
    assert native_build.library() is None and native_build.unavailable_reason() == "NINFER_CPU_KERNELS=torch"
    monkeypatch.setattr(native_build, "_state", {})
    monkeypatch.setenv("NINFER_CPU_KERNELS", "native")
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    assert native_build.library() is None
    assert "building the native CPU kernels failed" in native_build.unavailable_reason()
    assert list((tmp_path / "native").iterdir()) == []  # no half-written library left behind
    monkeypatch.setattr(native_build, "_state", {})
    monkeypatch.setenv("NINFER_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="NINFER_CPU_KERNELS=fast"):
        native_build.library()


def test_build_is_cached_per_source_and_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "_state", {})
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    assert native_build.library() is not None
    built = list((tmp_path / "native").iterdir())
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native_build, "_state", {})
    assert native_build.library() is not None
    assert [p.stat().st_mtime_ns for p in (tmp_path / "native").iterdir()] == [mtime]  # not rebuilt


# (Hk, Hv, Dk, Dv): Qwen3.5's shape (Hv = 2 Hk, 128 x 128), equal heads, Dk != Dv, a tail past 16 lanes
DELTA_SHAPES = [(2, 4, 128, 128), (3, 3, 64, 64), (1, 2, 32, 48), (2, 2, 20, 36)]


@pytest.mark.parametrize("hk,hv,dk,dv", DELTA_SHAPES)
@pytest.mark.parametrize("lengths", [[1, 1, 1], [5, 0, 17]])  # decode; prefill chunks with an empty one
@pytest.mark.parametrize("l2norm", [True, False])
@pytest.mark.parametrize("padding", [False, True])  # the middle sequence a padding row (slot -1)
def test_gated_delta_rule(hk, hv, dk, dv, lengths, l2norm, padding):
    t = sum(lengths)
    conv = torch.randn(t, 2 * hk * dk + hv * dv + 3)  # q / k / v as views into one conv output, as the layer
    q = conv[:, : hk * dk].view(t, hk, dk)
    k = conv[:, hk * dk : 2 * hk * dk].view(t, hk, dk)
    v = conv[:, 2 * hk * dk : 2 * hk * dk + hv * dv].view(t, hv, dv)
    g = -torch.rand(t, hv) * 0.5
    beta = torch.rand(t, hv)
    state = torch.randn(5, hv, dk, dv) * 0.1
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    slots = torch.tensor([4, -1 if padding else 0, 2], dtype=torch.int32)
    if not l2norm:
        q, k = q * 0.1, k * 0.1  # bounded without the norm
    want_state = state.clone()
    want = gated_delta_naive.gated_delta_rule(q, k, v, g, beta, want_state, cu, slots, l2norm)
    got = gated_delta_native.gated_delta_rule(q, k, v, g, beta, state, cu, slots, l2norm)
    assert rel_err(got, want) < TOL
    assert rel_err(state, want_state) < TOL  # every sequence's state written back, slots 1 and 3 untouched
    if padding:
        assert not got[cu[1] : cu[2]].any() and torch.equal(state[0], want_state[0])


def test_gated_delta_rule_refuses_a_slot_outside_the_state():
    q = k = torch.randn(2, 1, 32)
    v, g, beta, state = torch.randn(2, 1, 32), -torch.rand(2, 1), torch.rand(2, 1), torch.zeros(3, 1, 32, 32)
    cu, slots = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    for bad in (3, -2):  # past the state; below -1 (padding)
        with pytest.raises(ValueError, match="out of range"):
            gated_delta_native.gated_delta_rule(
                q, k, v, g, beta, state, cu, torch.tensor([bad], dtype=torch.int32)
            )
    assert not state.any()  # nothing written
    assert gated_delta_native.gated_delta_rule(q.double(), k, v, g, beta, state, cu, slots) is None
    assert (
        gated_delta_native.gated_delta_rule(q, k, v, g[:1], beta, state, cu, slots) is None
    )  # the twin names it


@pytest.mark.parametrize("channels,kernel", [(300, 4), (40, 2), (520, 3)])  # blocks of 256 and a tail
@pytest.mark.parametrize("lengths", [[1, 1, 1], [6, 0, 2]])
@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("padding", [False, True])  # the middle sequence a padding row (slot -1)
def test_causal_conv1d(channels, kernel, lengths, silu, padding):
    t = sum(lengths)
    x = torch.randn(t, channels + 9)[
        :, 3 : 3 + channels
    ]  # rows with a stride, as a view into in_proj's output
    weight = torch.randn(channels, kernel)
    state = torch.randn(4, channels, kernel - 1)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    slots = torch.tensor([3, -1 if padding else 1, 0], dtype=torch.int32)
    want_state = state.clone()
    want = conv1d_naive.causal_conv1d(x, weight, want_state, cu, slots, silu)
    got = conv1d_native.causal_conv1d(x, weight, state, cu, slots, silu)
    assert rel_err(got, want) < TOL
    assert torch.equal(state, want_state)  # the last K - 1 inputs, copied
    if padding:
        assert not got[cu[1] : cu[2]].any()


def test_causal_conv1d_refuses_a_slot_outside_the_state():
    x, weight, state = torch.randn(2, 8), torch.randn(8, 4), torch.zeros(2, 8, 3)
    cu, slots = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    for bad in (2, -2):  # past the state; below -1 (padding)
        with pytest.raises(ValueError, match="out of range"):
            conv1d_native.causal_conv1d(x, weight, state, cu, torch.tensor([bad], dtype=torch.int32))
    assert not state.any()
    assert conv1d_native.causal_conv1d(x.bfloat16(), weight, state, cu, slots) is None
