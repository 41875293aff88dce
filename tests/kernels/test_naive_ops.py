"""Each naive op against an independent formulation (transformers' reference functions or dense math).

The Triton kernels will be tested against these naive twins; here the twins themselves are pinned down.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

import ninfer_kernels as kernels
from engine.cache.kv_layout import KVCache
from ninfer_kernels.kv_quant.naive import (
    V4_GROUP,
    dequantize_int4_grouped,
    quantize_int4_grouped,
    quantize_int8,
)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (
        (a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt().clamp_min(1e-12)
    ).item()


@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm(zero_centered, with_residual, dtype):
    x, res, w = torch.randn(7, 64, dtype=dtype), torch.randn(7, 64, dtype=dtype), torch.randn(64, dtype=dtype)
    out = kernels.rmsnorm(x, w, 1e-6, res if with_residual else None, zero_centered)
    h = x + res if with_residual else x
    if with_residual:
        out, new_res = out
        assert torch.equal(new_res, h)
    norm = ref.Qwen3_5RMSNorm(64) if zero_centered else None
    if zero_centered:
        norm.weight.data = w
        expected = norm(h)
    else:
        hf = h.float()
        expected = w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    assert out.dtype == dtype
    assert rel_err(out, expected) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_rmsnorm_gated():
    x, z, w = torch.randn(5, 4, 32), torch.randn(5, 4, 32), torch.randn(32)
    norm = ref.Qwen3_5RMSNormGated(32)
    norm.weight.data = w
    expected = norm(x.reshape(-1, 32), z.reshape(-1, 32)).reshape(5, 4, 32)
    assert rel_err(kernels.rmsnorm_gated(x, z, w, 1e-6), expected) < 1e-6


@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 128), (256, 64)])
@pytest.mark.parametrize("tokens", [9, 40])  # decode-sized steps take the per-token rotation matrices
def test_rope_neox_partial(head_dim, rotary_dim, tokens):
    q, k = torch.randn(tokens, 4, head_dim), torch.randn(tokens, 2, head_dim)
    positions = torch.tensor([0, 1, 2, 7, 100, 5000, 3, 3, 65535, *range(11, tokens + 2)])[:tokens]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat([freqs, freqs], -1)
    eq, ek = ref.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin(), unsqueeze_dim=1)
    cos_sin_cache = torch.cat([freqs.cos(), freqs.sin()], -1)  # rows indexed by position 0..T-1
    oq, ok = kernels.rope(q, k, torch.arange(len(positions)), cos_sin_cache)
    assert rel_err(oq, eq) < 1e-6 and rel_err(ok, ek) < 1e-6


def test_silu_mul():
    x = torch.randn(6, 2 * 48)
    assert torch.allclose(kernels.silu_mul(x), torch.nn.functional.silu(x[:, :48]) * x[:, 48:])


# RMS-relative error bound of the attention output per KV dtype (fp32 reference, random unit-scale data)
KV_TOL = {
    "fp32": 1e-5,
    "bf16": 1e-2,
    "fp16": 2e-3,
    "fp8": 8e-2,
    "int8": 2e-2,
    "k8v4": 0.15,
}  # int4 V: ~9% RMS per 32-group


@pytest.mark.parametrize("kv_dtype", list(KV_TOL))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_attention_matches_dense_causal(kv_dtype, head_dim, num_heads, num_kv_heads, block_size):
    torch.manual_seed(0)
    # two sequences: one prefilling 11 new tokens after a 6-token prefix, one decoding 1 token after 20
    prefix, new = [6, 20], [11, 1]
    num_blocks = 32
    cache = KVCache.allocate(kv_dtype, num_blocks, block_size, num_kv_heads, head_dim, "cpu")
    perm = torch.randperm(num_blocks).tolist()  # pages scattered, not contiguous
    tables, full_k, full_v = [], [], []
    for b in range(2):
        total = prefix[b] + new[b]
        blocks = [perm.pop() for _ in range(-(-total // block_size))]
        tables.append(blocks + [0] * (8 - len(blocks)))
        k, v = torch.randn(total, num_kv_heads, head_dim), torch.randn(total, num_kv_heads, head_dim)
        slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(total)])
        kernels.kv_store(k, v, cache, slots)
        full_k.append(k)
        full_v.append(v)
    q = torch.randn(sum(new), num_heads, head_dim)
    cu = torch.tensor([0, new[0], new[0] + new[1]], dtype=torch.int32)
    seq_lens = torch.tensor([p + n for p, n in zip(prefix, new)], dtype=torch.int32)
    out = kernels.paged_attention(
        q, cache, torch.tensor(tables, dtype=torch.int32), seq_lens, cu, head_dim**-0.5
    )
    for b in range(2):
        qb = q[cu[b] : cu[b + 1]].transpose(0, 1)  # [H, Q, D]
        kb = full_k[b].repeat_interleave(num_heads // num_kv_heads, 1).transpose(0, 1)
        vb = full_v[b].repeat_interleave(num_heads // num_kv_heads, 1).transpose(0, 1)
        total, q_len = kb.shape[1], qb.shape[1]
        mask = torch.arange(total)[None, :] <= torch.arange(total - q_len, total)[:, None]
        expected = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
        assert rel_err(out[cu[b] : cu[b + 1]], expected.transpose(0, 1)) < KV_TOL[kv_dtype]


def test_kv_store_skips_negative_slots():
    cache = KVCache(kv_dtype="fp32", k_data=torch.zeros(2, 4, 1, 8), v_data=torch.zeros(2, 4, 1, 8))
    k = torch.ones(3, 1, 8)
    kernels.kv_store(k, k, cache, torch.tensor([0, -1, 7]))
    assert cache.k_data.view(-1, 8).sum(-1).tolist() == [8, 0, 0, 0, 0, 0, 0, 8]


def test_int8_and_int4_round_trip():
    x = torch.randn(5, 3, 64) * 4
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (5, 3, 1)
    assert ((q.float() * scale.float() - x).abs() <= scale.float() * 0.5 + 1e-3).all()
    packed, scale4 = quantize_int4_grouped(x)
    assert (
        packed.shape == (5, 3, 32) and packed.dtype == torch.uint8 and scale4.shape == (5, 3, 64 // V4_GROUP)
    )
    back = dequantize_int4_grouped(packed, scale4)
    bound = scale4.float().repeat_interleave(V4_GROUP, -1) * 0.5 + 1e-3
    assert ((back - x).abs() <= bound).all()


@pytest.mark.parametrize("lens", [[1], [9, 1, 4]])
def test_causal_conv1d_continues_from_state(lens):
    channels, kernel = 12, 4
    weight = torch.randn(channels, kernel)
    seqs = [torch.randn(n * 2, channels) for n in lens]
    state = torch.zeros(len(lens), channels, kernel - 1)
    idx = torch.arange(len(lens), dtype=torch.int32)
    outs = [[], []]
    for half in range(2):  # run each sequence in two pieces; the state carries across
        pieces = [s[half * n : (half + 1) * n] for s, n in zip(seqs, lens)]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        out = kernels.causal_conv1d(torch.cat(pieces), weight, state, cu, idx)
        for b in range(len(lens)):
            outs[half].append(out[cu[b] : cu[b + 1]])
    for b, s in enumerate(seqs):
        expected = ref.causal_conv1d_fn(s.t()[None], weight, activation="silu")[0].t()
        assert rel_err(torch.cat([outs[0][b], outs[1][b]]), expected) < 1e-6


@pytest.mark.parametrize("num_k_heads,num_v_heads", [(2, 2), (2, 4)])
def test_gated_delta_rule_matches_chunked_reference(num_k_heads, num_v_heads):
    torch.manual_seed(0)
    lens, dk, dv = [37, 5], 16, 8
    total = sum(lens)
    q, k = torch.randn(total, num_k_heads, dk), torch.randn(total, num_k_heads, dk)
    v = torch.randn(total, num_v_heads, dv)
    g = -torch.rand(total, num_v_heads)
    beta = torch.rand(total, num_v_heads)
    init = torch.randn(2, num_v_heads, dk, dv) * 0.1
    state = init.clone()
    cu = torch.tensor([0, lens[0], total], dtype=torch.int32)
    out = kernels.gated_delta_rule(q, k, v, g, beta, state, cu, torch.tensor([1, 0], dtype=torch.int32))
    for b, slot in enumerate([1, 0]):
        s, e = cu[b], cu[b + 1]
        exp_o, exp_state = ref.torch_chunk_gated_delta_rule(
            q[None, s:e],
            k[None, s:e],
            v[None, s:e],
            g=g[None, s:e],
            beta=beta[None, s:e],
            initial_state=init[slot : slot + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        assert rel_err(out[s:e], exp_o[0]) < 1e-5
        assert rel_err(state[slot], exp_state[0]) < 1e-5


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("merged", [True, False])
def test_attend_parts_equals_one_masked_attention(monkeypatch, merged, device):
    """Key ranges attended part by part (flash + log-sum-exp merge, or one masked call) = plain attention;
    on CUDA, where the CPU flash op does not run, always the masked call."""
    import importlib

    naive = importlib.import_module("ninfer_kernels.paged_attention.naive")
    if not merged:
        monkeypatch.setattr(naive, "_flash_with_lse", None)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 6, 5, 32), torch.randn(1, 2, 40, 32), torch.randn(1, 2, 40, 32)
    got = naive.attend_parts(q.to(device), k.to(device), v.to(device), [(0, 30, False), (35, 40, True)], 0.2)
    got = got.cpu()
    keys = torch.cat([torch.arange(30), torch.arange(35, 40)])
    mask = torch.ones(5, 35, dtype=torch.bool)
    mask[:, 30:] = torch.arange(5)[None, :] <= torch.arange(5)[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k[:, :, keys], v[:, :, keys], attn_mask=mask, scale=0.2, enable_gqa=True
    )
    assert (got - want).abs().max() < (1e-5 if device == "cpu" else 1e-4)  # (CUDA: other summation orders)


@pytest.mark.parametrize(
    "pages",
    [
        [3, 4, 5, 6, 7],  # one run, ascending
        [7, 6, 5, 4, 3],  # one run, descending: the last page's unused tail sits mid-run
        [9, 2, 3, 14, 10],  # three runs
        list(range(0, 80, 2)),  # forty runs: gathered instead
    ],
)
@pytest.mark.parametrize("seq_len_in_last_page", [1, 4])
def test_single_sequence_decode_reads_page_runs_in_place(pages, seq_len_in_last_page):
    torch.manual_seed(1)
    block_size, hk, hq, d = 4, 2, 6, 32
    cache = KVCache.allocate("fp32", 80, block_size, hk, d, "cpu")
    cache.k_data.normal_()  # garbage in every slot the sequence does not own
    cache.v_data.normal_()
    seq_len = (len(pages) - 1) * block_size + seq_len_in_last_page
    k, v = torch.randn(seq_len, hk, d), torch.randn(seq_len, hk, d)
    slots = torch.tensor([pages[p // block_size] * block_size + p % block_size for p in range(seq_len)])
    kernels.kv_store(k, v, cache, slots)
    q = torch.randn(1, hq, d)
    table = torch.tensor([pages + [0] * 2], dtype=torch.int32)
    out = kernels.paged_attention(q, cache, table, torch.tensor([seq_len]), torch.tensor([0, 1]), d**-0.5)
    ke, ve = (
        k.repeat_interleave(hq // hk, 1).transpose(0, 1),
        v.repeat_interleave(hq // hk, 1).transpose(0, 1),
    )
    expected = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), ke, ve)  # [H, 1, D]
    assert rel_err(out, expected.transpose(0, 1)) < 1e-5
