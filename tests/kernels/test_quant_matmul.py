"""The fused W4A16 / W8A16 matmul (GEMM for prefill shapes, split-K GEMV for M <= 16) against its naive twin,
and the engine running a .ninfer model with its weights left packed through it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import triton.language as tl
from conftest import save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.quant.convert import convert
from engine.quant.groupwise import dequantize, quantize
from engine.quant.layer import GroupwiseWeight, holds_packed_weights
from ninfer_kernels.quant_matmul import DEQUANT_MIN_M, DEQUANT_SCRATCH_BYTES, dequant, naive
from ninfer_kernels.quant_matmul import triton as fused

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _operands(qt) -> tuple:
    """quant_matmul's weight arguments for a QuantizedTensor, on DEVICE: packed, scales, minimums, bits,
    group_size."""
    mins = qt.minimums.to(DEVICE) if qt.minimums is not None else None
    return qt.packed.to(DEVICE), qt.scales.to(DEVICE), mins, qt.bits, qt.group_size


@pytest.mark.parametrize("bits", [4, 6, 8])
@pytest.mark.parametrize(
    "n,k", [(96, 256), (80, 300), (64, 130), (48, 576)]
)  # 300, 130: padded; 576: groups of 64
@pytest.mark.parametrize("m", [1, 3, 16, 77])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_matmul_matches_naive(bits, n, k, m, dtype):
    torch.manual_seed(m + k)
    qt = quantize(torch.randn(n, k) * 0.05, bits, 128)
    assert qt.group_size == (64 if k == 576 else 128)
    packed, scales = qt.packed.to(DEVICE), qt.scales.to(DEVICE)
    mins = qt.minimums.to(DEVICE) if qt.minimums is not None else None
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    got = fused.quant_matmul(x, packed, scales, mins, bits, qt.group_size)
    want = naive.quant_matmul(x, packed, scales, mins, bits, qt.group_size)
    assert got.shape == (m, n) and got.dtype == dtype
    assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 1e-2)
    # the naive twin is x @ dequantize(W)^T
    assert (
        rel_err(want.float(), x.float().cpu() @ dequantize(qt).t() if DEVICE == "cpu" else want.float())
        < 1e-2
    )


@pytest.mark.parametrize(
    "bits,n,k,group",
    [(4, 200, 300, 128), (4, 70, 160, 32), (4, 90, 576, 64), (6, 130, 300, 64), (8, 65, 50, 16)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_rows_matches_naive(bits, n, k, group, dtype):
    """The long-prefill path's dequantization: any run of rows (here from row 5, n not a multiple of the
    program's 32 rows, K not of the group) as the naive twin decodes it; to rounding in fp32 (a wrong code
    is off by a whole scale step, ~1e-2 of the weight)."""
    torch.manual_seed(n + k)
    qt = quantize(torch.randn(n, k) * 0.05, bits, group, False)
    args = _operands(qt)
    out = torch.full((n - 5, k), float("nan"), device=DEVICE, dtype=dtype)
    dequant.dequantize_rows(*args, 5, out)
    want = naive.dequantize_weight(*args, k)[5:]
    if dtype == torch.float32:  # one rounding apart at most (a GPU fuses q * scale + minimum into an FMA)
        assert (out - want).abs().max() <= 1e-6 * want.abs().max()
    else:
        assert rel_err(out, want) < 1e-2 and not out.isnan().any()


@pytest.mark.parametrize("bits,k,group", [(4, 300, 128), (6, 256, 64), (8, 200, 128)])
@pytest.mark.parametrize("m", [3, DEQUANT_MIN_M + 44])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_chunks_multiply_dequantized_slices(monkeypatch, bits, k, group, m, dtype):
    """From DEQUANT_MIN_M rows of x on, quant_matmul dequantizes the weight into the scratch by slices of
    64 rows (a scratch of 64 rows here: 200 rows take four, 64, 64, 64 and 8) and multiplies each with
    torch.mm into its columns of the output; below it, the fused kernels run. Either way, the naive
    product."""
    torch.manual_seed(m + k)
    qt = quantize(torch.randn(200, k) * 0.05, bits, group, False)
    args = _operands(qt)
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    slices = []
    real_mm = torch.mm
    monkeypatch.setattr(
        dequant.torch, "mm", lambda a, b, out: slices.append(b.shape[1]) or real_mm(a, b, out=out)
    )
    monkeypatch.setattr(dequant, "DEQUANT_SCRATCH_BYTES", 64 * k * x.element_size())
    got = fused.quant_matmul(x, *args)
    assert slices == ([64, 64, 64, 8] if m >= DEQUANT_MIN_M else [])
    assert got.shape == (m, 200) and got.dtype == dtype
    assert rel_err(got, naive.quant_matmul(x, *args)) < (1e-3 if dtype == torch.float32 else 1e-2)


def test_dequantized_slices_are_balanced_whole_row_blocks():
    """The 27B MLP shapes in bf16 fit the 64 MiB scratch in three balanced slices of whole 64-row blocks;
    a row wider than the scratch still gets one block."""
    assert DEQUANT_SCRATCH_BYTES == 64 << 20
    assert dequant.slice_rows(17408, 5120, 2) == 5824  # up / gate: 3 slices (5824, 5824, 5760)
    assert dequant.slice_rows(5120, 17408, 2) == 1728  # down: 3 slices (1728, 1728, 1664)
    assert dequant.slice_rows(1024, 5120, 2) == 1024  # fits at once
    assert dequant.slice_rows(100, 1 << 26, 2) == 64


@pytest.mark.parametrize("m", [1, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_4bit_groups_of_32_take_two_products_over_the_column_parities(m, dtype):
    """A GGUF's Q4 blocks and q4.6's upgraded matrices keep groups of 32: the row read as int32 words, one
    product over the even columns and one over the odd (each 16 long), five groups (K = 160)."""
    torch.manual_seed(m)
    qt = quantize(torch.randn(48, 160) * 0.05, 4, 32)
    packed, scales, mins = qt.packed.to(DEVICE), qt.scales.to(DEVICE), qt.minimums.to(DEVICE)
    x = torch.randn(m, 160, device=DEVICE).to(dtype)
    got = fused.quant_matmul(x, packed, scales, mins, 4, 32)
    want = naive.quant_matmul(x, packed, scales, mins, 4, 32)
    assert qt.group_size == 32 and rel_err(got, want) < (1e-3 if dtype == torch.float32 else 1e-2)


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU runs these operands as they are, in the test above")
@pytest.mark.parametrize(
    "bits,k,group", [(4, 300, 128), (4, 576, 64), (4, 256, 32), (6, 300, 128), (8, 300, 128)]
)
@pytest.mark.parametrize("m", [1, 5, 20])
def test_half_precision_operands_match_naive(monkeypatch, bits, k, group, m):
    """On a GPU the products take the model's half dtype, the codes turned into floats by magic-number bit
    operations (4 and 6 bits) or a cast (8 bits). The interpreter computes fp16 faithfully (not bf16), so
    here fp16 operands are forced on it: this runs the GPU's code path, bit tricks and all."""
    monkeypatch.setattr(fused, "dot_dtype", lambda dtype: tl.float16)
    torch.manual_seed(m + k)
    qt = quantize(torch.randn(72, k) * 0.05, bits, group)
    x = torch.randn(m, k).half()
    got = fused.quant_matmul(x, qt.packed, qt.scales, qt.minimums, bits, qt.group_size)
    want = naive.quant_matmul(x, qt.packed, qt.scales, qt.minimums, bits, qt.group_size)
    assert got.dtype == torch.float16 and rel_err(got, want) < 2e-3


def test_gemv_slices_spread_a_matrix_over_every_sm():
    """Split-K slices: ~8 programs per SM (132 on the CPU's nominal device), never more slices than groups."""
    cpu = torch.device("cpu")
    assert fused.gemv_splits(17408, 40, 64, cpu) == 4  # 272 tiles x 4 = 1088 programs for 132 SMs
    assert fused.gemv_splits(1024, 40, 64, cpu) == 40  # 16 tiles: one group per program
    assert fused.gemv_splits(248320, 40, 64, cpu) == 1  # the vocabulary head fills the GPU by itself


@pytest.mark.parametrize(
    "block_m,block_n,num_splits,m,sums_by_dot",
    [
        (None, 32, 3, 1, None),
        (None, 256, 2, 5, None),
        (None, 64, 1, 3, None),
        (None, 32, None, 40, None),
        (64, 128, None, 70, None),
        (None, 64, 2, 1, False),  # a GEMV adding the group sums in fp32
        (None, 32, None, 40, True),  # a GEMM taking them from products with ones
    ],
)
def test_tuning_knobs_keep_the_result(block_m, block_n, num_splits, m, sums_by_dot):
    """The sweep's tile, K-slice and group-sum choices (benchmarks/gpu_kernels.py) compute the same product;
    a GEMV in one K slice (num_splits 1) stores its output directly instead of adding into an fp32 buffer."""
    torch.manual_seed(m)
    qt = quantize(torch.randn(200, 900) * 0.05, 4, 128)
    packed, scales, mins = qt.packed.to(DEVICE), qt.scales.to(DEVICE), qt.minimums.to(DEVICE)
    x = torch.randn(m, 900, device=DEVICE)
    knobs = dict(block_m=block_m, block_n=block_n, num_splits=num_splits, sums_by_dot=sums_by_dot)
    got = fused.quant_matmul(x, packed, scales, mins, 4, 128, **knobs)
    assert rel_err(got, naive.quant_matmul(x, packed, scales, mins, 4, 128)) < 1e-3


CUDA_CORE_SHAPES = [(300, 640, 128), (130, 1000, 128), (64, 200, 64), (96, 96, 32), (70, 576, 64)]


@pytest.mark.parametrize(
    "bits,n,k,group",
    [(4, *shape) for shape in CUDA_CORE_SHAPES]
    + [(6, *shape) for shape in CUDA_CORE_SHAPES if shape[2] > 32]
    + [(8, *shape) for shape in CUDA_CORE_SHAPES]
    + [(8, 40, 80, 16)],
)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_core_gemv_matches_naive(bits, n, k, group, num_splits, dtype):
    """The GEMVs at M = 1 on the CUDA cores (gemv4.py, gemv6.py, gemv8.py: codes read as floats 2^E + c at a
    bit of a shifted word where 2^E makes their unit 1; 8-bit codes signed): every code value at every
    position of a word, K not a multiple of the group (the last group's padding meets zero activations),
    one K slice (stored directly) or three (the split-K buffer)."""
    torch.manual_seed(n + k)
    qt = quantize(torch.randn(n, k) * 0.05, bits, group)
    packed, scales, mins, bits, group = _operands(qt)
    x = torch.randn(1, k, device=DEVICE).to(dtype)
    want = naive.quant_matmul(x.float(), packed, scales, mins, bits, group)
    # stages 3: the next groups' words copied ahead (a GPU's cp.async); prefetch (4-bit): loaded into
    # registers a step ahead; the same sums
    for stages, prefetch in ((1, False), (3, False), (1, True)) if bits == 4 else ((1, False), (3, False)):
        knobs = dict(cuda_cores=True, num_splits=num_splits, block_n=64, num_stages=stages, prefetch=prefetch)
        got = fused.quant_matmul(x, packed, scales, mins, bits, group, **knobs)
        assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 1e-2)
    sums, arrivals = fused.split_buffers(x.device, n, -(-n // 64))
    assert not sums.any() and not arrivals.any()


@pytest.mark.parametrize("n,k,group", CUDA_CORE_SHAPES)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half2_gemv_matches_naive(n, k, group, num_splits, dtype):
    """The 4-bit GEMV in packed half precision (gemv4h.py, the half2 knob; its f16x2 PTX emulated under
    the interpreter): two codes an FMA read as (16 + c, 16 + c'), every code value at every position of a
    word, K not a multiple of the group, a row tile past N; fp16 partial sums over two words cost
    2.5-5.2e-3 (bf16 bound)."""
    torch.manual_seed(n + k)
    qt = quantize(torch.randn(n, k) * 0.05, 4, group)
    packed, scales, mins, bits, group = _operands(qt)
    x = torch.randn(1, k, device=DEVICE).to(dtype)
    want = naive.quant_matmul(x.float(), packed, scales, mins, bits, group)
    knobs = dict(cuda_cores=True, half2=True, num_splits=num_splits, block_n=64)
    got = fused.quant_matmul(x, packed, scales, mins, bits, group, **knobs)
    assert rel_err(got, want) < 1e-2
    with pytest.raises(AssertionError, match="16-bit x"):
        fused.quant_matmul(x.float(), packed, scales, mins, bits, group, **knobs)


ACT_ORDER_PATHS = {  # every kernel quant_matmul has: (rows of x, knobs)
    "gemv_cuda_cores": (1, dict(cuda_cores=True)),
    "half2": (3, dict(cuda_cores=True, half2=True)),
    "gemv_tensor_cores": (5, dict(cuda_cores=False)),
    "gemm": (40, dict(dequant=False)),
    "dequantized_slices": (40, dict(dequant=True)),
}


ACT_ORDER_SHAPES = [(4, 130, 1000, 128), (4, 96, 96, 32), (6, 70, 576, 64), (8, 64, 200, 64)]


@pytest.mark.parametrize(
    "path,bits,n,k,group",
    [
        (path, *shape)
        for path in ACT_ORDER_PATHS
        for shape in ACT_ORDER_SHAPES
        if path != "half2" or shape[0] == 4
    ],
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_act_order_columns_are_gathered_as_x_loads(path, bits, n, k, group, num_splits):
    """An act-order weight (stored column j holds input column columns[j]: its groups gathered from scattered
    columns): every kernel loads x through the order, as x[:, columns] @ W^T, on every path (K padded
    past the last group, K sliced, rows past N); without the order the result is another."""
    torch.manual_seed(n + k + bits)
    qt = quantize(torch.randn(n, k) * 0.05, bits, group)
    packed, scales, mins, bits, group = _operands(qt)
    columns = torch.randperm(k, generator=torch.Generator().manual_seed(k)).to(torch.int32).to(DEVICE)
    m, knobs = ACT_ORDER_PATHS[path]
    dtype = torch.bfloat16 if path == "half2" else torch.float32
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    want = naive.quant_matmul(x[:, columns.long()].float(), packed, scales, mins, bits, group)
    assert torch.equal(
        want, naive.quant_matmul(x.float(), packed, scales, mins, bits, group, columns=columns)
    )
    splits = dict(num_splits=num_splits) if "gemv" in path or path == "half2" else {}
    got = fused.quant_matmul(x, packed, scales, mins, bits, group, columns=columns, **knobs, **splits)
    assert rel_err(got, want) < (1e-3 if dtype == torch.float32 else 1e-2)
    assert rel_err(fused.quant_matmul(x, packed, scales, mins, bits, group, **knobs, **splits), want) > 0.1


def test_an_act_order_layer_hands_its_order_to_the_kernel(kernel_backend, monkeypatch):
    """GroupwiseWeight passes x as it is and its column order to quant_matmul (no gather launched before
    the kernel on the 16-bit path) and gets what the gathered input gives."""
    import ninfer_kernels

    kernel_backend("triton")
    torch.manual_seed(3)
    qt = quantize(torch.randn(96, 256) * 0.05, 4, 128)
    weight = GroupwiseWeight.from_shards([qt], "cpu")
    weight.columns = torch.randperm(256).to(torch.int32)
    x = torch.randn(2, 256)
    want = naive.quant_matmul(x[:, weight.columns.long()], qt.packed, qt.scales, qt.minimums, 4, 128)
    calls, kernel = [], ninfer_kernels.quant_matmul
    monkeypatch.setattr(
        ninfer_kernels, "quant_matmul", lambda *a, **kw: calls.append((a, kw)) or kernel(*a, **kw)
    )
    got = weight(x)
    assert len(calls) == 1 and calls[0][0][0] is x and calls[0][1]["columns"] is weight.columns
    assert rel_err(got, want) < 1e-3


@pytest.mark.parametrize("value,on", [("1", True), ("0", False), (None, False)])
def test_gemv_half2_switch_reads_its_environment_variable(value, on, tmp_path):
    """NINFER_GEMV_HALF2=1 at import turns GEMV_HALF2 on (gpu_check.sh's DUMMY_HALF2 times a decode both
    ways)."""
    env = {k: v for k, v in os.environ.items() if k != "NINFER_GEMV_HALF2"} | (
        {"NINFER_GEMV_HALF2": value} if value else {}
    )
    code = "from ninfer_kernels.quant_matmul import triton; print(triton.GEMV_HALF2)"
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert run.stdout.split()[-1:] == [str(on)], run.stderr[-2000:]


def test_gemv_half2_switch_takes_the_f16x2_kernel_for_16_bit_activations(monkeypatch):
    """GEMV_HALF2 (the default of the half2 knob) sends 4-bit calls of up to HALF2_MAX_M rows with 16-bit
    activations to gemv4h.py and leaves fp32 activations, 8-bit weights and more rows where they were."""
    torch.manual_seed(11)
    qt4, qt8 = quantize(torch.randn(96, 640) * 0.05, 4, 128), quantize(torch.randn(96, 640) * 0.05, 8, 128)
    w4, w8 = _operands(qt4), _operands(qt8)
    x = torch.randn(1, 640, device=DEVICE).to(torch.bfloat16)
    knobs = dict(cuda_cores=True, block_n=64)
    half2, gemv4 = (fused.quant_matmul(x, *w4, **knobs, half2=h) for h in (True, False))
    assert not torch.equal(half2, gemv4)  # (two kernels, two roundings)
    monkeypatch.setattr(fused, "GEMV_HALF2", True)
    assert torch.equal(fused.quant_matmul(x, *w4, **knobs), half2)
    assert torch.equal(
        fused.quant_matmul(x.float(), *w4, **knobs), fused.quant_matmul(x.float(), *w4, **knobs, half2=False)
    )
    assert torch.equal(fused.quant_matmul(x, *w8, **knobs), fused.quant_matmul(x, *w8, **knobs, half2=False))
    x3, x5 = x.repeat(3, 1), x.repeat(5, 1)  # up to HALF2_MAX_M rows in one program; more: the tensor cores
    assert torch.equal(fused.quant_matmul(x3, *w4, **knobs), fused.quant_matmul(x3, *w4, **knobs, half2=True))
    assert torch.equal(
        fused.quant_matmul(x5, *w4, **knobs), fused.quant_matmul(x5, *w4, **knobs, half2=False)
    )


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("n,k,group", [(130, 1000, 128), (70, 576, 64), (96, 96, 32)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_half2_gemv_takes_up_to_four_activation_rows(m, n, k, group, num_splits):
    """gemv4h.py with 2-4 activation rows in one program (C2-C4 decode, speculative verification): each
    row its own slice scale (rows 1e-7 and 1e4 apart), rows read through strides (a slice of a wider
    tensor, an output with a wider pitch), three rows padded to four (the fourth neither read past x nor
    stored), K slices added in the split-K buffer and left zero."""
    torch.manual_seed(m * n + k)
    qt = quantize(torch.randn(n, k) * 0.05, 4, group)
    packed, scales, mins, bits, group = _operands(qt)
    magnitudes = torch.tensor([1.0, 1e-7, 1e4, 0.5][:m], device=DEVICE)[:, None]
    x = (torch.randn(m, k + 40, device=DEVICE) * magnitudes).to(torch.bfloat16)[:, :k]
    wide = torch.full((m, n + 8), 7.0, device=DEVICE, dtype=torch.bfloat16)
    want = naive.quant_matmul(x.float(), packed, scales, mins, bits, group)
    knobs = dict(cuda_cores=True, half2=True, num_splits=num_splits, block_n=64)
    fused.quant_matmul(x, packed, scales, mins, bits, group, wide[:, :n], **knobs)
    for row in range(m):  # (each row against its own scale: one row 1e-7 of another would pass a joint bound)
        assert rel_err(wide[row, :n], want[row]) < 1e-2, row
    assert (wide[:, n:] == 7.0).all()
    sums, arrivals = fused.split_buffers(x.device, n, -(-n // 64))
    assert not sums.any() and not arrivals.any()


@pytest.mark.parametrize(
    "dtype,magnitude", [(torch.float16, 1e-4), (torch.bfloat16, 1e-4), (torch.bfloat16, 1e5)]
)
def test_half2_gemv_keeps_its_precision_at_any_activation_magnitude(dtype, magnitude):
    """The f16x2 GEMV scales each K slice's activations by a power of two that brings their largest into
    [32, 64) (from its exponent bits): activations of 1e-4 (fp16 subnormals at a fixed 2^-8: ~3% error) and
    positive ones of 1e5 (bf16: a chain's eight products a half past fp16's 65504 at a fixed 2^-8, inf) keep
    the error of activations near 1, and zero activations give zeros, not NaN."""
    torch.manual_seed(7)
    qt = quantize(torch.randn(96, 640) * 0.05, 4, 128)
    packed, scales, mins, bits, group = _operands(qt)
    x = torch.randn(1, 640, device=DEVICE) * magnitude
    x = (x.abs() if magnitude > 1 else x).to(dtype)
    want = naive.quant_matmul(x.float(), packed, scales, mins, bits, group)
    for num_splits in (1, 3):
        knobs = dict(cuda_cores=True, half2=True, num_splits=num_splits, block_n=64)
        got = fused.quant_matmul(x, packed, scales, mins, bits, group, **knobs)
        assert torch.isfinite(got).all() and rel_err(got, want) < 1e-2
    zeros = fused.quant_matmul(torch.zeros_like(x), packed, scales, mins, bits, group, **knobs)
    assert not zeros.any()


def test_split_gemv_leaves_its_buffers_clean_for_the_next():
    """A split-K GEMV's last K slice per tile stores the tile and zeroes its partial sums and arrival
    counter: GEMVs that share them (same outputs and tiles: two layers' projections) each get their own
    product, call after call, and the buffers are zero between calls."""
    torch.manual_seed(3)
    weights = [quantize(torch.randn(200, 900) * 0.05, bits, 128) for bits in (4, 8, 4)]
    for step in range(3):
        for qt in weights:
            args = _operands(qt)
            x = torch.randn(1 + step * 3, 900, device=DEVICE)
            got = fused.quant_matmul(x, *args, block_n=32, num_splits=3)
            assert rel_err(got, naive.quant_matmul(x, *args)) < 1e-3
            sums, arrivals = fused.split_buffers(x.device, 200, 7)
            assert not sums.any() and not arrivals.any()


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_cores", [False, True])
def test_split_gemv_last_slice_sees_every_slice_on_a_gpu(cuda_cores):
    """On a GPU the K slices of a tile run at once, so the last to arrive must see every other slice's adds
    (the counter's release / acquire) and leave zeros behind: 200 calls of a 17408 x 5120 4-bit GEMV in 40
    slices (5440 programs, 136 counters) all equal the first, which equals the reference."""
    torch.manual_seed(5)
    qt = quantize(torch.randn(17408, 5120) * 0.02, 4, 128, clip_search=False)  # seconds, not a minute
    args = (qt.packed.cuda(), qt.scales.cuda(), qt.minimums.cuda(), 4, 128)
    x = torch.randn(1, 5120, device="cuda", dtype=torch.bfloat16)
    first = fused.quant_matmul(x, *args, num_splits=40, cuda_cores=cuda_cores)
    assert rel_err(first.float(), naive.quant_matmul(x.float(), *args).float()) < 1e-2
    worst = max(
        (fused.quant_matmul(x, *args, num_splits=40, cuda_cores=cuda_cores).float() - first.float())
        .abs()
        .max()
        .item()
        for _ in range(200)
    )
    assert worst <= 1e-2 * first.float().abs().max().item()  # atomics add in any order: rounding only


def test_narrow_6bit_groups_are_refused_by_the_kernel_and_dequantized_at_load():
    from engine.quant.layer import fused_kernel_takes

    assert fused_kernel_takes(6, 128) and fused_kernel_takes(6, 64) and not fused_kernel_takes(6, 32)
    assert fused_kernel_takes(4, 32) and fused_kernel_takes(8, 16) and not fused_kernel_takes(5, 128)
    qt = quantize(torch.randn(16, 64), 6, 32)
    x = torch.randn(1, 64, device=DEVICE)
    with pytest.raises(AssertionError, match="6-bit groups of 32"):
        fused.quant_matmul(x, qt.packed.to(DEVICE), qt.scales.to(DEVICE), qt.minimums.to(DEVICE), 6, 32)


@pytest.mark.parametrize("path", ["gemv", "gemm", "dequant", "naive"])
def test_output_into_a_wider_tensors_columns(path):
    """out=: the product lands in a column view of a wider output (a fused projection's part), on every
    path; the columns around it are left as they were."""
    torch.manual_seed(5)
    qt = quantize(torch.randn(200, 900) * 0.05, 4, 128, False)
    args = _operands(qt)
    x = torch.randn(1 if path == "gemv" else 20, 900, device=DEVICE)
    wide = torch.full((len(x), 330), float("nan"), device=DEVICE)
    view = wide[:, 70:270]
    if path == "naive":
        got = naive.quant_matmul(x, *args, view)
    else:
        got = fused.quant_matmul(
            x, *args, view, dequant=path == "dequant", num_splits=3 if path == "gemv" else None
        )
    assert got.data_ptr() == view.data_ptr()
    assert rel_err(view, naive.quant_matmul(x, *args)) < 1e-3
    assert wide[:, :70].isnan().all() and wide[:, 270:].isnan().all()


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_shards_of_different_widths_stay_packed_apart(kernel_backend, backend):
    """q4.6 picks bits per tensor, so q / k / v of one fused projection may differ: runs of equal (bits,
    group) fuse, the rest are separate kernel calls, each writing its columns of one output."""
    from engine.quant.layer import ConcatenatedWeights, packed_weight

    kernel_backend(backend)

    torch.manual_seed(0)
    ws = [torch.randn(n, 256) * 0.05 for n in (64, 32, 32, 48)]
    shards = [quantize(w, b, g) for w, (b, g) in zip(ws, [(4, 128), (8, 128), (8, 128), (6, 128)])]
    weight = packed_weight(shards, DEVICE)
    assert isinstance(weight, ConcatenatedWeights) and [p.bits for p in weight.parts] == [4, 8, 6]
    assert weight.nbytes == sum(s.nbytes for s in shards)
    x = torch.randn(3, 256, device=DEVICE)
    want = x.cpu() @ torch.cat([dequantize(s) for s in shards]).t()
    assert rel_err(weight(x).cpu(), want) < 1e-3
    assert isinstance(packed_weight(shards[1:3], DEVICE), GroupwiseWeight)  # equal widths: one weight


def test_groupwise_weight_concatenates_fused_shards():
    q, k = quantize(torch.randn(32, 256), 4), quantize(torch.randn(16, 256), 4)
    w = GroupwiseWeight.from_shards([q, k], "cpu")
    x = torch.randn(2, 256)
    want = x @ torch.cat([dequantize(q), dequantize(k)]).t()
    assert rel_err(w(x), want) < 1e-5


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_first_rows_of_a_packed_weight_share_its_storage(bits):
    """The MTP drafts' head (lm_head_draft) is a packed lm_head's first rows: views, the same products."""
    qt = quantize(torch.randn(48, 256), bits)
    w = GroupwiseWeight.from_shards([qt], "cpu")
    head = w.first_rows(20)
    x = torch.randn(3, 256)
    assert head.out_features == 20 and head.packed.data_ptr() == w.packed.data_ptr()
    assert rel_err(head(x), w(x)[:, :20]) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe,bits,dequant_min_m", [("w4g128", 4, None), ("w6g128", 6, None), ("w4g128", 4, 16)]
)
def test_engine_keeps_weights_packed_through_the_fused_kernel(
    tmp_path, monkeypatch, kernel_backend, recipe, bits, dequant_min_m
):
    """A w4g128 / w6g128 .ninfer of a tiny Llama: packed weights through the Triton kernel (interpreted on
    CPU, compiled on a GPU) generate the tokens the dequantized dense weights do. dequant_min_m 16: the
    21-token prompt is a long chunk, through dequantized slices and torch.mm (decode stays on the GEMV)."""
    long_chunks = []  # rows of each product through the dequantized slices
    if dequant_min_m is not None:
        monkeypatch.setattr(fused, "DEQUANT_MIN_M", dequant_min_m)
        slices = fused.dequant_matmul
        monkeypatch.setattr(
            fused, "dequant_matmul", lambda x, *a: long_chunks.append(len(x)) or slices(x, *a)
        )
    src = save_tiny(
        tiny_hf_model("llama", tied=True, seed=3, hidden_size=128, intermediate_size=256), tmp_path / "src"
    )
    out = tmp_path / "m.ninfer"
    convert(src, out, recipe)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    prompt = list(range(40, 61))
    where = dict(weight_quant="none", device=DEVICE, dtype="float32")  # (a GPU's default, bf16, moves ties)
    kernel_backend("naive")
    dense_llm = LLM(out, **where)
    dense = dense_llm.generate(prompt_token_ids=prompt, sampling_params=params)[0]
    kernel_backend("triton")
    packed_llm = LLM(out, **where)
    # the memory ledger's dequant scratch row follows this (engine/memory.py)
    assert holds_packed_weights(packed_llm.model) and not holds_packed_weights(dense_llm.model)
    layer = packed_llm.model.model.layers[0]
    assert (
        isinstance(layer.self_attn.qkv_proj.qweight, GroupwiseWeight)
        and layer.self_attn.qkv_proj.weight is None
        and layer.self_attn.qkv_proj.qweight.bits == bits
    )
    embed = packed_llm.model.model.embed_tokens
    assert isinstance(packed_llm.model.lm_head.qweight, GroupwiseWeight)  # tied: the packed head ...
    assert embed.qweight is packed_llm.model.lm_head.qweight and embed.weight is None  # ... is the table
    got = packed_llm.generate(prompt_token_ids=prompt, sampling_params=params)[0]
    assert got.token_ids == dense.token_ids
    # with dequant_min_m 16, the prompt's qkv, o, gate_up and down products (per layer) took the slices
    assert all(m == len(prompt) for m in long_chunks)
    assert (len(long_chunks) >= 4) == (dequant_min_m is not None)
    for a, b in zip(got.logprobs, dense.logprobs):
        assert all(abs(a[t] - b[t]) < 1e-3 for t in b)


@pytest.mark.parametrize("recipe", ["w4g128", "w6g128", "w8g128", "q4.6"])
def test_planner_counts_the_weights_the_loader_holds(tmp_path, kernel_backend, recipe):
    """artifact_weight_bytes (plan, serve's ledger) = the bytes the fused-kernel loader keeps: packed
    matrices (every width) plus the dense rest."""
    from engine.plan.weights import artifact_weight_bytes

    src = save_tiny(
        tiny_hf_model("llama", tied=False, seed=3, hidden_size=128, intermediate_size=256), tmp_path / "src"
    )
    out = tmp_path / "m.ninfer"
    convert(src, out, recipe)
    kernel_backend("triton")
    llm = LLM(out, weight_quant="none", device=DEVICE, dtype="float32")  # the 4 bytes counted below
    packed = {id(m.qweight): m.qweight.nbytes for m in llm.model.modules() if getattr(m, "qweight", None)}
    held = sum(packed.values()) + sum(p.numel() * p.element_size() for p in llm.model.parameters())
    assert len(packed) >= 4 and held == sum(
        artifact_weight_bytes(out, llm.model_config, dtype_bytes=4).values()
    )


def test_packed_matrices_never_get_dense_storage(tmp_path, monkeypatch, kernel_backend):
    """Kept packed, a .ninfer's matrices are built on the meta device and never allocated dense, not even
    between construction and loading (a 27B model's dense matrices would need 54 GB on a 24 GB card);
    only those loaded dense get storage. The model then has no meta parameter left."""
    from engine.layers import linear
    from engine.models import loader

    src = save_tiny(
        tiny_hf_model("llama", tied=True, seed=3, hidden_size=128, intermediate_size=256), tmp_path / "s"
    )
    convert(src, tmp_path / "m.ninfer", "w4g128")
    kernel_backend("triton")
    built = []  # (dims, on meta) of every parameter the model's layers create
    make = linear.make_param
    monkeypatch.setattr(
        linear, "make_param", lambda *a, **k: built.append((len(a), (p := make(*a, **k)).is_meta)) or p
    )
    materialized = []
    real = loader.materialize
    monkeypatch.setattr(
        loader, "materialize", lambda p, d: (p.is_meta and materialized.append(p.shape), real(p, d))
    )
    llm = LLM(tmp_path / "m.ninfer", weight_quant="none", device=DEVICE)
    assert built and all(meta == (dims >= 2) for dims, meta in built)
    assert not materialized  # every matrix of w4g128 is packed
    assert not any(p.is_meta for p in llm.model.parameters())
    assert all(m.weight is None for m in llm.model.modules() if getattr(m, "qweight", None) is not None)
    out = llm.generate(
        prompt_token_ids=[[5, 6, 7]], sampling_params=SamplingParams(max_tokens=3, ignore_eos=True)
    )
    assert len(out[0].token_ids) == 3
