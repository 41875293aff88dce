"""int4 weights x int8 activations on x86 CPUs (AVX-512 VNNI): the CPU decode matmul of 4-bit layers.

`pack` lays out codes and fp16 scales as native.c reads them, `unpack` reads them back (tests),
`dequantize_t_bf16` gives the weight transposed in bf16 (prefill's GEMM), `matmul` runs the compiled
kernel (kernels/native_build.py) where `available()`, else the naive twin (same math in torch, float64).
Shapes: N a multiple of ROWS, K a multiple of GROUP.
"""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import check, has_q4, library
from ninfer_kernels.q4_cpu.naive import BLOCK_BYTES, GROUP, ROWS, dequantize, q4_matmul, unpack

__all__ = [
    "BLOCK_BYTES",
    "GROUP",
    "ROWS",
    "available",
    "dequantize",
    "dequantize_t_bf16",
    "matmul",
    "pack",
    "supports",
    "unpack",
]

FP16_MIN_NORMAL = 2.0**-14
FP16_MAX = 65504.0


def available() -> bool:
    return has_q4()


def supports(n: int, k: int, scale: torch.Tensor, minimum: torch.Tensor) -> bool:
    """Whether a weight packs exactly enough: shape multiples, and fp16 holds its scales to 11 bits
    (nonzero scales at least fp16's smallest normal, everything below fp16's largest value)."""
    if n % ROWS or k % GROUP:
        return False
    nonzero = scale[scale > 0]
    small = nonzero.numel() > 0 and nonzero.min().item() < FP16_MIN_NORMAL
    large = max(scale.abs().max().item(), minimum.abs().max().item()) >= FP16_MAX
    return not (small or large)


def pack(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """codes [N, K] in 0..15, scale / minimum [N, K / GROUP] (w = scale * code + minimum)
    -> [N / ROWS, K / GROUP, BLOCK_BYTES] uint8."""
    n, k = codes.shape
    nb, g = n // ROWS, k // GROUP
    steps = codes.to(torch.uint8).view(nb, ROWS, g, 8, 4).permute(0, 2, 3, 1, 4).reshape(nb, g, 8, 4 * ROWS)
    nibbles = (steps[:, :, :4] | (steps[:, :, 4:] << 4)).reshape(nb, g, 4 * 4 * ROWS)  # step t | t + 4

    def fp16_bytes(t: torch.Tensor) -> torch.Tensor:  # [N, G] -> [NB, G, 2 ROWS]
        return t.reshape(nb, ROWS, g).transpose(1, 2).to(torch.float16).contiguous().view(torch.uint8)

    return torch.cat([nibbles, fp16_bytes(scale), fp16_bytes(minimum)], dim=-1).contiguous()


def _check_shape(packed: torch.Tensor, n: int, k: int) -> None:
    """What the C reads must be what `pack` made of an [n, k] weight: a contiguous uint8
    [N / ROWS, K / GROUP, BLOCK_BYTES] (dtype and contiguity `pack` guarantees; the shape is the caller's)."""
    if packed.shape[0] * ROWS != n or packed.shape[1] * GROUP != k:
        raise ValueError(f"an int4 weight packed as {tuple(packed.shape)} is not [{n}, {k}]")


def matmul(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] -> [M, N] fp32 (x in fp32 or converted). Called ~120 times a decode step: the checks are
    kept to what `pack` does not already guarantee."""
    if not has_q4():
        return q4_matmul(x.float(), packed, n)
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    m, k = x.shape
    _check_shape(packed, n, k)
    y = torch.empty(m, n)
    check(library().ninfer_q4_matmul(packed.data_ptr(), x.data_ptr(), y.data_ptr(), m, n, k), "int4 matmul")
    return y


def dequantize_t_bf16(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Wt [K, N] bf16: w = scale * code + minimum in fp32, rounded to bf16 (the same bits as unpacking in
    torch and converting), transposed."""
    if not has_q4():
        return dequantize(packed, n, k).to(torch.bfloat16).t().contiguous()
    _check_shape(packed, n, k)
    wt = torch.empty(k, n, dtype=torch.bfloat16)
    check(library().ninfer_q4_dequantize_t_bf16(packed.data_ptr(), wt.data_ptr(), n, k), "int4 dequantize")
    return wt
