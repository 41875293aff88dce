"""The mixture-of-experts kernels (kernels/fused_moe/triton.py) against the naive twin: the expert sort,
and the grouped matmuls over dense and packed experts; on CUDA where there is one, else under
TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from engine.quant.groupwise import quantize
from ninfer_kernels.fused_moe import naive
from ninfer_kernels.fused_moe import triton as moe

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("tokens,k,experts,block_m", [(1, 2, 8, 16), (37, 3, 6, 16), (70, 2, 8, 64)])
def test_moe_align_groups_assignments_by_expert_in_whole_blocks(tokens, k, experts, block_m):
    torch.manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)]).to(DEVICE)
    sorted_ids, block_expert, num_padded = moe.moe_align(ids, experts, block_m)
    n = tokens * k
    used = sorted_ids[: num_padded.item()].cpu()
    real = used[used < n]
    assert sorted(real.tolist()) == list(range(n))  # every assignment once
    assert sorted_ids.numel() >= num_padded.item() and num_padded.item() % block_m == 0
    flat = ids.reshape(-1).cpu()
    for b in range(num_padded.item() // block_m):  # a block holds one expert's assignments
        block = used[b * block_m : (b + 1) * block_m]
        assert (flat[block[block < n].long()] == block_expert[b].item()).all()


@pytest.mark.parametrize(
    "tokens,k,experts,block_m",
    [(1, 8, 128, 16), (4, 8, 128, 16), (16, 8, 512, 16), (1, 2, 8, 16), (37, 3, 6, 16), (20, 6, 60, 64)],
)
def test_one_kernel_aligns_decode_steps_as_the_torch_ops_do(tokens, k, experts, block_m):
    """Up to ALIGN_KERNEL_MAX assignments (decode steps, drafts too) one program sorts them: the same
    sorted list, block experts and padded total as the torch ops, entry for entry (experts hit by several
    assignments and by none, more experts than one counting step takes, a 64-row block)."""
    torch.manual_seed(tokens * experts)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
    ids[1:] = ids[1:] % max(3, experts // 8) if tokens > 2 else ids[1:]  # experts shared by many tokens
    ids = ids.to(DEVICE)
    assert ids.numel() <= moe.ALIGN_KERNEL_MAX
    got = moe._align_small(ids, experts, block_m)
    want = moe._align_torch(ids, experts, block_m)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.int32 and torch.equal(g, w)


def _experts(e, n, k, bits, group, dtype, scattered=False):
    """Random experts [E, N, K]: dense, or packed; `scattered`: each expert's columns stored in an order of
    its own (act-order checkpoints: PackedExperts.columns)."""
    w = torch.randn(e, n, k) * 0.1
    if bits == 16:
        return w.to(dtype).to(DEVICE)
    qts = [quantize(w[i], bits, group, False) for i in range(e)]
    mins = torch.stack([q.minimums for q in qts]).to(DEVICE) if qts[0].minimums is not None else None
    stack = [torch.stack([getattr(q, a) for q in qts]).to(DEVICE) for a in ("packed", "scales")]
    columns = (
        torch.stack([torch.randperm(k) for _ in range(e)]).to(torch.int32).to(DEVICE) if scattered else None
    )
    return naive.PackedExperts(*stack, mins, bits, qts[0].group_size, k, columns)


@pytest.mark.parametrize("bits,group", [(16, 0), (4, 128), (4, 32), (6, 64), (8, 128)])
@pytest.mark.parametrize("tokens", [1, 19])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_matches_naive(bits, group, tokens, dtype):
    """Dense experts and every packed width (K = 96 padded to a group of 128, K = 64 in groups of at most
    64); a decode-sized step (one token) and a prompt; N not a multiple of the tiles for dense experts."""
    torch.manual_seed(bits + tokens)
    experts, k = 6, 2
    hidden, inter = (96, 40) if bits == 16 else (128 if bits == 6 else 96, 64)
    gate_up = _experts(experts, 2 * inter, hidden, bits, group, dtype)
    down = _experts(experts, hidden, inter, bits, min(group, 64), dtype)
    _check_against_naive(gate_up, down, tokens, k, dtype)


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 128)])
@pytest.mark.parametrize("tokens", [1, 19])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_order_experts_gather_their_columns(bits, group, tokens, dtype):
    """Each expert's columns stored in an order of its own (PackedExperts.columns): the kernel reads x's
    columns in that order, as the naive twin's dequantized experts (columns put back) multiply x; K = 96
    padded to a group of 128 too."""
    torch.manual_seed(bits + tokens)
    experts, k, hidden, inter = 6, 2, 96, 64
    gate_up = _experts(experts, 2 * inter, hidden, bits, group, dtype, scattered=True)
    down = _experts(experts, hidden, inter, bits, min(group, 64), dtype, scattered=True)
    x = torch.randn(tokens, hidden).to(dtype).to(DEVICE)
    weights, ids = naive.moe_route(torch.randn(tokens, experts, device=DEVICE), k, True)
    got = moe.fused_moe(x, gate_up, down, weights, ids)
    want = naive.fused_moe(x, gate_up, down, weights, ids)
    in_order = naive.fused_moe(x, gate_up._replace(columns=None), down._replace(columns=None), weights, ids)
    assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 2e-2)
    assert rel_err(in_order, want) > 0.3  # (the orders matter)


def _fp4_experts(e: int, n: int, k: int, fmt: str) -> naive.Fp4Experts:
    """Random FP4 experts [E, N, K] (kernels/fp4_matmul's layout): codes, scale codes around 1 (e4m3) or
    2^-3 (e8m0), row multipliers."""
    group, e8m0 = (32, True) if fmt == "mxfp4" else (16, False)
    packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8)
    if e8m0:
        scales = torch.randint(120, 128, (e, n, k // group), dtype=torch.uint8)
    else:
        scales = (torch.rand(e, n, k // group) + 0.25).to(torch.float8_e4m3fn).view(torch.uint8)
    mult = torch.rand(e, n) * 0.05 + 0.01
    return naive.Fp4Experts(packed.to(DEVICE), scales.to(DEVICE), mult.to(DEVICE), group, e8m0, k)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("tokens", [1, 19, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp4_experts_match_naive(fmt, tokens, dtype):
    """An NVFP4 / MXFP4 checkpoint's experts as stored (e2m1 codes, e4m3 / e8m0 group scales, a tensor scale
    a row, decoded in the kernel's loads): as the naive twin's dequantized experts; decode-sized steps, a
    prompt, and 70 tokens (64-assignment blocks)."""
    torch.manual_seed(tokens)
    experts, k, hidden, inter = 6, 2, 96, 64
    gate_up = _fp4_experts(experts, 2 * inter, hidden, fmt)
    down = _fp4_experts(experts, hidden, inter, fmt)
    assert gate_up.shape == (experts, 2 * inter, hidden)
    _check_against_naive(gate_up, down, tokens, k, dtype)


def _check_against_naive(gate_up, down, tokens: int, k: int, dtype: torch.dtype) -> None:
    """The kernel's output for random tokens routed to k experts, against the naive twin's: fp32 1e-3, bf16
    2e-2 RMS-relative."""
    experts, _, hidden = gate_up.shape
    x = torch.randn(tokens, hidden).to(dtype).to(DEVICE)
    weights, ids = naive.moe_route(torch.randn(tokens, experts, device=DEVICE), k, True)
    got = moe.fused_moe(x, gate_up, down, weights, ids)
    want = naive.fused_moe(x, gate_up, down, weights, ids)
    assert got.shape == (tokens, hidden) and got.dtype == dtype
    assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 2e-2)
