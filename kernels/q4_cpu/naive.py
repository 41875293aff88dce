"""The naive twin of native.c: the same activation quantization and integer sums in torch (float64)."""

from __future__ import annotations

import torch

ROWS = 16  # output rows per block: one per 32-bit lane of a 512-bit register
GROUP = 32  # input columns per scale
BLOCK_BYTES = 4 * 4 * ROWS + 2 * 2 * ROWS  # codes of 8 steps x ROWS rows x 4 columns, fp16 scale, minimum


def unpack(packed: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N / ROWS, K / GROUP, BLOCK_BYTES] -> codes [N, K] uint8, scale and minimum [N, K / GROUP] fp32."""
    nb, g = n // ROWS, k // GROUP
    nibbles = packed[..., : 4 * 4 * ROWS].reshape(nb, g, 4, 4 * ROWS)
    steps = torch.cat([nibbles & 0xF, nibbles >> 4], dim=2)  # [NB, G, 8, 4 ROWS]
    codes = steps.view(nb, g, 8, ROWS, 4).permute(0, 3, 1, 2, 4).reshape(n, k)

    def fp16_at(start: int) -> torch.Tensor:
        raw = packed[..., start : start + 2 * ROWS].contiguous().view(torch.float16)  # [NB, G, ROWS]
        return raw.float().transpose(1, 2).reshape(n, g)

    return codes, fp16_at(4 * 4 * ROWS), fp16_at(4 * 4 * ROWS + 2 * ROWS)


def dequantize(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """W [N, K] fp32: w = scale * code + minimum per (row, group)."""
    codes, scale, lo = unpack(packed, n, k)
    return (codes.float().view(n, k // GROUP, GROUP) * scale[..., None] + lo[..., None]).view(n, k)


def quantize_activations(x: torch.Tensor):
    """x [M, K] fp32 -> q1, q2 [M, G, GROUP] (integers as fp32), scale and sum [M, G] fp32:
    x ~ scale * (254 q1 + q2) per group, scale = max|x| / 127 / 254, rounding as native.c rounds."""
    m, k = x.shape
    xg = x.float().reshape(m, k // GROUP, GROUP)
    d1 = xg.abs().amax(dim=-1, keepdim=True) / 127.0
    inv1 = torch.where(d1 > 0, 1.0 / d1, torch.zeros_like(d1))
    q1 = torch.round(xg * inv1)
    q2 = torch.round((xg - q1 * d1) * (inv1 * 254.0))
    return q1, q2, (d1 / 254.0).squeeze(-1), xg.sum(dim=-1)


def q4_matmul(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] fp32 -> [M, N] fp32: per group, scale_w * scale_x * (254 S1 + S2) + minimum * sum(x)."""
    m, k = x.shape
    codes, scale, minimum = unpack(packed, n, k)
    q1, q2, xscale, xsum = quantize_activations(x)
    c = codes.double().view(n, k // GROUP, GROUP)
    sums = 254.0 * torch.einsum("mgk,ngk->mng", q1.double(), c) + torch.einsum("mgk,ngk->mng", q2.double(), c)
    y = (sums * scale.double()[None] * xscale.double()[:, None]).sum(
        -1
    ) + xsum.double() @ minimum.double().t()
    return y.float()
