"""Long prefill chunks: the weight dequantized a slice of rows at a time into a scratch buffer, each slice
multiplied by cuBLAS.

The fused GEMM (triton.py) decodes every weight tile once per BLOCK_M rows of x, in the tensor cores' inner
loop, and its instruction issue caps it well under the half-precision peak (docs/kernels.md). From
DEQUANT_MIN_M rows on, decoding each weight once per call costs less: it writes 2 bytes a weight and cuBLAS
reads them back (with the packed 0.5 bytes, ~1 ps a weight on an H200), against a product of 2 M FLOP a
weight that cuBLAS runs near the peak. vLLM's AWQ path switches the same way at 256 tokens;
benchmarks/gpu_kernels.py times both paths side by side at M = 512 and 2048.

Layout: engine/quant/groupwise.py's (kernels/quant_matmul/triton.py describes it). The scratch is one flat
buffer per device and dtype, DEQUANT_SCRATCH_BYTES, kept for the process; a weight larger than it is done
in balanced slices of whole 64-row blocks, each product written straight into its columns of the output
(cuBLAS takes the output's row stride). One stream at a time (the engine's): a slice's dequantization
waits for the previous slice's product in stream order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ninfer_kernels.quant_matmul import DEQUANT_SCRATCH_BYTES
from ninfer_kernels.triton_codes import unpack_codes

DEQUANT_BLOCK_N = 32  # weight rows a program (one group of columns each)
ROW_ALIGN = 64  # slices are whole multiples of this many rows


@triton.jit
def _dequantize_kernel(
    packed_ptr,  # uint8 [N, Kp / 2] (4-bit), int32 view of [N, 3 Kp / 4] bytes (6-bit), int8 [N, Kp] (8-bit)
    scales_ptr,  # fp16 [N, G]
    mins_ptr,  # fp16 [N, G] (4 / 6-bit)
    out_ptr,  # [ROWS, K] in the model dtype: rows row0 .. row0 + ROWS of the weight
    row0,
    ROWS,
    K,
    KP,
    num_groups,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One group of columns of BLOCK_N rows a program: w = q * scale (+ minimum), in fp32, stored in out's
    dtype."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    group = tl.program_id(1)
    k0 = group * GROUP_SIZE
    n_mask = offs_n < ROWS
    rows = row0 + offs_n
    scale = tl.load(scales_ptr + rows * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    q = unpack_codes(packed_ptr, rows, n_mask, k0, KP, BITS, BLOCK_N, GROUP_SIZE)
    w = q.to(tl.float32) * scale[:, None]
    if HAS_MINS:
        w += tl.load(mins_ptr + rows * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    cols = k0 + tl.arange(0, GROUP_SIZE)
    mask = n_mask[:, None] & (cols < K)[None, :]
    tl.store(out_ptr + offs_n[:, None] * K + cols[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_rows(
    packed: torch.Tensor,
    scales: torch.Tensor,  # fp16 [N, G]
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    row0: int,
    out: torch.Tensor,  # [rows, K], contiguous: receives weight rows row0 .. row0 + rows
) -> torch.Tensor:
    """Rows of a group-wise quantized weight in out's dtype (the naive twin: naive.dequantize_weight)."""
    rows, k = out.shape
    num_groups = scales.shape[1]
    assert out.is_contiguous() and packed.is_contiguous() and row0 + rows <= scales.shape[0]
    grid = (triton.cdiv(rows, DEQUANT_BLOCK_N), triton.cdiv(k, group_size))
    _dequantize_kernel[grid](
        packed.view(torch.int32) if bits == 6 else packed,
        scales,
        minimums if minimums is not None else scales,
        out,
        row0,
        rows,
        k,
        num_groups * group_size,
        num_groups,
        BITS=bits,
        GROUP_SIZE=group_size,
        HAS_MINS=minimums is not None,
        BLOCK_N=DEQUANT_BLOCK_N,
        num_warps=4,
    )
    return out


def slice_rows(n: int, k: int, itemsize: int) -> int:
    """Weight rows dequantized at a time: the fewest slices DEQUANT_SCRATCH_BYTES hold, balanced, in whole
    ROW_ALIGN-row blocks (at least one block, however wide the rows)."""
    cap = max(ROW_ALIGN, DEQUANT_SCRATCH_BYTES // (k * itemsize) // ROW_ALIGN * ROW_ALIGN)
    slices = triton.cdiv(n, cap)
    return min(cap, triton.cdiv(triton.cdiv(n, slices), ROW_ALIGN) * ROW_ALIGN)


_SCRATCH: dict[tuple, torch.Tensor] = {}


def scratch(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The flat dequantization buffer of a device and dtype, DEQUANT_SCRATCH_BYTES (more only when one
    ROW_ALIGN-row block is wider), kept for the process."""
    key = (device, dtype)
    if key not in _SCRATCH or _SCRATCH[key].numel() < numel:
        size = max(numel, DEQUANT_SCRATCH_BYTES // dtype.itemsize)
        _SCRATCH[key] = torch.empty(size, dtype=dtype, device=device)
    return _SCRATCH[key]


def dequant_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scales: torch.Tensor,  # fp16 [N, G]
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    out: torch.Tensor,  # [M, N] in x's dtype, unit column stride
) -> torch.Tensor:
    """y = x W^T into out by slices of W dequantized into the scratch (the naive twin: naive.quant_matmul)."""

    def fill(row0: int, w: torch.Tensor) -> None:
        dequantize_rows(packed, scales, minimums, bits, group_size, row0, w)

    return sliced_matmul(x, scales.shape[0], out, fill)


def sliced_matmul(
    x: torch.Tensor,  # [M, K]
    n: int,
    out: torch.Tensor,  # [M, N] in x's dtype, unit column stride
    fill: Callable[[int, torch.Tensor], None],
) -> torch.Tensor:
    """y = x W^T into out, W [N, K] a slice of rows at a time: fill(row0, w) writes W's rows row0 .. row0 +
    len(w) into w (a view of the scratch, in x's dtype), which cuBLAS multiplies into out's columns."""
    k = x.shape[1]
    rows = slice_rows(n, k, x.element_size())
    buf = scratch(x.device, x.dtype, rows * k)
    for row0 in range(0, n, rows):
        w = buf[: min(rows, n - row0) * k].view(-1, k)  # [rows, K]
        fill(row0, w)
        torch.mm(x, w.t(), out=out[:, row0 : row0 + w.shape[0]])
    return out
