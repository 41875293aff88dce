"""The int8 prefill path: activations quantized per (token, group) (kernels/int8_act) and the group-wise
quantized weight times those codes on the int8 tensor cores (kernels/int8_matmul), each against its naive
twin; on CUDA where there is one, else under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

import ninfer_kernels as kernels
from engine.quant.groupwise import quantize
from ninfer_kernels.int8_act import QMAX
from ninfer_kernels.int8_act import naive as act_naive
from ninfer_kernels.int8_act import triton as act_triton
from ninfer_kernels.int8_matmul import naive as mm_naive
from ninfer_kernels.int8_matmul import triton as mm_triton
from ninfer_kernels.quant_matmul import naive as a16_naive

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("m,k,group", [(1, 128, 128), (5, 300, 128), (17, 96, 32), (3, 2600, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_act_matches_naive(m, k, group, dtype):
    torch.manual_seed(m * k)
    x = (torch.randn(m, k) * torch.logspace(-3, 2, k)).to(dtype).to(DEVICE)  # groups of very different sizes
    x[0, :group] = 0  # an all-zero group: scale 0, codes 0
    codes, scales, sums = act_triton.quantize_act(x, group)
    want_codes, want_scales, want_sums = act_naive.quantize_act(x.cpu(), group)
    groups = -(-k // group)
    assert codes.shape == (m, groups * group) and codes.dtype == torch.int8
    assert scales.shape == sums.shape == (m, groups) and scales.dtype == torch.float32
    # x * (QMAX / max) one rounding apart (the division's) may put a code near a half on the other side
    diff = (codes.cpu().int() - want_codes.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 1e-3
    assert torch.allclose(scales.cpu(), want_scales, rtol=1e-6, atol=0)
    assert torch.equal(sums.cpu(), codes.cpu().view(m, groups, group).int().sum(-1))
    assert scales[0, 0] == 0 and not codes[0, :group].any() and not codes[:, k:].any()
    # each element within half a step of x, the group's largest at +-QMAX
    back = act_naive.dequantize_act(codes.cpu(), scales.cpu())[:, :k]
    step = scales.cpu().repeat_interleave(group, dim=1)[:, :k]
    assert ((back - x.cpu().float()).abs() <= step * 0.5001).all()
    assert (codes.cpu().view(m, groups, group).abs().amax(-1)[scales.cpu() > 0] == QMAX).all()


SHAPES = [(96, 256, 128), (200, 300, 128), (80, 320, 64), (70, 96, 32)]  # n, k, group


# every width at the groups the loader keeps packed (6-bit from 64), N and K not multiples of the tiles
@pytest.mark.parametrize(
    "bits,n,k,group", [(b, *s) for b in (4, 6, 8) for s in SHAPES if b != 6 or s[2] >= 64]
)
@pytest.mark.parametrize("m", [17, 77, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_matmul_matches_naive(bits, n, k, group, m, dtype):
    """M across the 64 / 128-row tiles."""
    torch.manual_seed(bits + n + m)
    qt = quantize(torch.randn(n, k) * 0.05, bits, group, False)
    mins = qt.minimums.to(DEVICE) if qt.minimums is not None else None
    weight = (qt.packed.to(DEVICE), qt.scales.to(DEVICE), mins, bits, group)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    xq = act_naive.quantize_act(x.cpu(), group)
    got = mm_triton.int8_matmul(
        *(t.to(DEVICE) for t in xq), *weight, torch.empty(m, n, dtype=dtype, device=DEVICE)
    )
    want = mm_naive.int8_matmul(
        *xq, *(t.cpu() if torch.is_tensor(t) else t for t in weight), torch.empty(m, n)
    )
    # integer products are exact: the fp32 kernel differs from its twin by summation order only
    assert rel_err(got.cpu(), want) < (1e-5 if dtype == torch.float32 else 1e-2)
    # and the int8 activations cost ~1% against the 16-bit-activation matmul of the same weight
    a16 = a16_naive.quant_matmul(x.cpu().float(), *(t.cpu() if torch.is_tensor(t) else t for t in weight))
    assert rel_err(want, a16) < 2e-2


def test_public_ops_dispatch_and_agree():
    """kernels.quantize_act / kernels.int8_matmul: Triton on CUDA (or forced), the twins otherwise; the
    chain gives the twin's result."""
    torch.manual_seed(0)
    qt = quantize(torch.randn(64, 256) * 0.05, 4, 128, False)
    weight = (qt.packed.to(DEVICE), qt.scales.to(DEVICE), qt.minimums.to(DEVICE), 4, 128)
    x = torch.randn(40, 256, device=DEVICE)
    out = kernels.int8_matmul(*kernels.quantize_act(x, 128), *weight, torch.empty(40, 64, device=DEVICE))
    cpu = tuple(t.cpu() if torch.is_tensor(t) else t for t in weight)
    want = mm_naive.int8_matmul(*act_naive.quantize_act(x.cpu(), 128), *cpu, torch.empty(40, 64))
    assert rel_err(out.cpu(), want) < 1e-5


def test_int8_matmul_refuses_narrow_groups():
    qt = quantize(torch.randn(32, 64), 4, 16, False)
    xq = act_naive.quantize_act(torch.randn(20, 64), 16)
    with pytest.raises(AssertionError, match="32"):
        mm_triton.int8_matmul(*xq, qt.packed, qt.scales, qt.minimums, 4, 16, torch.empty(20, 32))
