"""The packed-table embedding lookup (kernels/quant_embedding): the Triton kernel against its naive twin
for every width, on CUDA where there is one, else under TRITON_INTERPRET=1; the twin against the dense
table."""

from __future__ import annotations

import pytest
import torch

from engine.quant.groupwise import dequantize, quantize
from ninfer_kernels.quant_embedding import naive
from ninfer_kernels.quant_embedding import triton as fused

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize("vocab,dim", [(300, 256), (97, 576), (50, 1100)])  # groups of 64; a padded row
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_embedding_matches_naive_and_the_dense_table(bits, vocab, dim, dtype):
    torch.manual_seed(bits + dim)
    qt = quantize(torch.randn(vocab, dim) * 0.05, bits, 128)
    args = [t.to(DEVICE) if t is not None else None for t in (qt.packed, qt.scales, qt.minimums)]
    ids = torch.tensor([0, vocab - 1, 3, 3, vocab // 2], device=DEVICE)
    got = fused.quant_embedding(ids, *args, bits, qt.group_size, dim, dtype)
    want = naive.quant_embedding(ids, *args, bits, qt.group_size, dim, dtype)
    assert got.shape == (5, dim) and got.dtype == dtype
    # the same codes times the same scales: fp32 within an ulp (a GPU may fuse the multiply-add); bf16 one
    # rounding (the interpreter's float -> bf16 conversion is not always round-to-nearest-even)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < (1e-6 if dtype == torch.float32 else 1e-2)
    table = dequantize(qt).to(DEVICE)
    assert torch.equal(want, table[ids].to(dtype))
