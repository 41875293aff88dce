"""The FP4 weight matmul (NVFP4: e2m1 codes, e4m3 scales a 16; MXFP4: e8m0 a 32) against its naive twin, and
the naive twin against the checkpoint reader's own dequantization (engine/formats/hf_fp4.py)."""

from __future__ import annotations

import pytest
import torch

from engine.formats.hf_fp4 import dequantize_fp4
from ninfer_kernels.fp4_matmul import DEQUANT_MIN_M, STEP, naive
from ninfer_kernels.fp4_matmul import triton as fused
from ninfer_kernels.quant_matmul import dequant

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORMATS = {"nvfp4": (16, False), "mxfp4": (32, True)}


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def fp4_operands(n: int, k: int, fmt: str, seed: int = 0):
    """Random codes, plausible scales (e4m3 around 1, e8m0 around 2^-4) and row multipliers, on DEVICE:
    packed, scale_codes, multiplier, group_size, e8m0."""
    group, e8m0 = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    groups = -(-k // group)
    if e8m0:
        scales = torch.randint(118, 130, (n, groups), generator=g, dtype=torch.uint8)
    else:
        scales = (torch.rand(n, groups, generator=g) * 3 + 0.002).to(torch.float8_e4m3fn).view(torch.uint8)
    mult = torch.rand(n, generator=g) * 0.02 + 0.001
    return packed.to(DEVICE), scales.to(DEVICE), mult.to(DEVICE), group, e8m0


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n,k", [(96, 256), (80, 320), (64, 208), (130, 96)])  # 320, 208, 96: not whole STEPs
@pytest.mark.parametrize("m", [1, 3, 16, 33, 77])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp4_matmul_matches_naive(fmt, n, k, m, dtype):
    """M <= 16: the split-K GEMVs (the CUDA cores at M = 1, eight tensor-core products a step above, one per
    code position of the words); 33: the tile kernel over three 16-row blocks, K whole; 77: dequantized
    slices."""
    args = fp4_operands(n, k, fmt, seed=m + k)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    got = fused.fp4_matmul(x, *args)
    want = naive.fp4_matmul(x, *args)
    assert got.shape == (m, n) and got.dtype == dtype
    assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_naive_twin_is_the_checkpoint_readers_dequantization(fmt):
    """The naive twin decodes as engine/formats/hf_fp4.py does for the CPU (its e2m1 table, e4m3 as torch
    reads it, e8m0 as 2^(s - 127)), the row multiplier being the tensor scale."""
    packed, scales, mult, group, e8m0 = (
        t.cpu() if torch.is_tensor(t) else t for t in fp4_operands(48, 256, fmt)
    )
    scale = torch.exp2(scales.float() - 127) if e8m0 else scales.view(torch.float8_e4m3fn)
    for row in (0, 17, 47):
        want = dequantize_fp4(packed[row : row + 1], scale[row : row + 1], mult[row].item(), group=group)
        got = naive.dequantize_weight(packed, scales, mult, group, e8m0, 256)[row : row + 1]
        assert rel_err(got, want.float()) < 4e-3  # (the reader rounds to bf16)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_code_and_scale_decodes_exactly(fmt):
    """All 256 bytes of codes (both nibbles, signs, e2m1's subnormal 0.5) against every scale code there is
    (e4m3's subnormals; not its NaN, 0x7F / 0xFF, which the loader refuses; e8m0 over its range), dequantized
    in fp32: bit for bit the naive twin's (the kernels' powers of two are exact)."""
    group, e8m0 = FORMATS[fmt]
    codes = [c for c in range(256) if ((c == 0 or 100 <= c <= 150) if e8m0 else c & 0x7F != 0x7F)]
    codes = sorted(codes, key=lambda c: c == 0)  # (0 last: among the rows dequantized from row 3)
    n, k = len(codes), 512
    packed = torch.arange(256, dtype=torch.uint8).repeat(n, 1).to(DEVICE)  # [n, 256]: every byte a row
    scales = torch.tensor(codes, dtype=torch.uint8)[:, None].repeat(1, k // group).contiguous().to(DEVICE)
    mult = torch.full((n,), 0.75, device=DEVICE)
    out = torch.full((n - 3, k), float("nan"), device=DEVICE)
    fused.dequantize_rows(packed, scales, mult, group, e8m0, 3, out)
    want = naive.dequantize_weight(packed, scales, mult, group, e8m0, k)
    assert torch.equal(out, want[3:])
    assert not want[codes.index(0)].any()  # (e4m3 0; e8m0 0, 2^-127, reads as 0 too)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("cuda_cores", [False, True])
def test_one_row_through_either_gemv_and_odd_widths_through_the_slices(fmt, cuda_cores):
    """M = 1 takes the CUDA-core GEMV (gemv.py) by default and the tensor-core tile as a knob; a K that is not
    a multiple of 8 (a row not whole int32 words) is multiplied through the dequantized slices at any M."""
    args = fp4_operands(72, 320, fmt, seed=4)
    x = torch.randn(1, 320, device=DEVICE)
    assert rel_err(fused.fp4_matmul(x, *args, cuda_cores=cuda_cores), naive.fp4_matmul(x, *args)) < 1e-5
    odd = fp4_operands(72, 204, fmt, seed=5)
    for m in (1, 3):
        x = torch.randn(m, 204, device=DEVICE)
        assert rel_err(fused.fp4_matmul(x, *odd), naive.fp4_matmul(x, *odd)) < 1e-5


@pytest.mark.parametrize("splits", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 5])
def test_k_slices_add_up_and_leave_the_buffers_clean(splits, m):
    """The split-K epilogue: any number of K slices (3 of 5 steps: uneven), the same result, called twice
    (each call leaves the shared partial-sum buffer and the arrival counters zero for the next)."""
    args = fp4_operands(72, 5 * STEP, "nvfp4", seed=splits)
    x = torch.randn(m, 5 * STEP, device=DEVICE)
    want = naive.fp4_matmul(x, *args)
    for _ in range(2):
        got = fused.fp4_matmul(x, *args, num_splits=splits)
        assert rel_err(got, want) < 1e-5


def test_writes_into_an_output_view_and_the_long_path_slices(monkeypatch):
    """`out` a column view of a wider output (a fused projection's part); DEQUANT_MIN_M rows and more go
    through the dequantized scratch in slices of whole 64-row blocks (a 64-row scratch here)."""
    args = fp4_operands(200, 256, "mxfp4", seed=9)
    wide = torch.zeros(DEQUANT_MIN_M + 4, 260, device=DEVICE)
    x = torch.randn(DEQUANT_MIN_M + 4, 256, device=DEVICE)
    slices = []
    real_mm = torch.mm
    monkeypatch.setattr(
        dequant.torch, "mm", lambda a, b, out: slices.append(b.shape[1]) or real_mm(a, b, out=out)
    )
    monkeypatch.setattr(dequant, "DEQUANT_SCRATCH_BYTES", 64 * 256 * 4)
    fused.fp4_matmul(x, *args, out=wide[:, 30:230])
    assert slices == [64, 64, 64, 8]
    assert rel_err(wide[:, 30:230], naive.fp4_matmul(x, *args)) < 1e-5
    assert not wide[:, :30].any() and not wide[:, 230:].any()
    slices.clear()
    fused.fp4_matmul(x[:2], *args, out=wide[:2, 30:230])  # the GEMV: no slices
    assert slices == [] and rel_err(wide[:2, 30:230], naive.fp4_matmul(x[:2], *args)) < 1e-5
