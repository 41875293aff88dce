"""Group-wise weight quantization along the input dimension, with packing.

A weight W [N, K] is split into groups of `group_size` input columns (K padded with zeros to a multiple).
* 4 and 6 bits: asymmetric, w ~ q * scale + minimum, q in [0, 2^bits - 1], fp16 scale and minimum per
  group. 4-bit codes are stored two per byte (even column in the low nibble); 6-bit codes four per three
  bytes (little-endian 24-bit words).
* 8 bits: symmetric, w ~ q * scale, q in [-127, 127], one fp16 scale per group, stored as int8.
Unpacking and dequantizing are the fused kernel's naive twin (kernels/quant_matmul/naive.py), so the
engine and the kernels read one layout the one way.

Each group's range is chosen by a clipping search: the candidate range (shrunk by one of CLIP_RATIOS)
with the least squared reconstruction error of the group wins, which trims outliers that would
otherwise waste most of the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer_kernels.quant_matmul.naive import dequantize_weight

BITS = (4, 6, 8)
MIN_GROUP = 32
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


@dataclass
class QuantizedTensor:
    bits: int
    group_size: int
    shape: tuple[int, int]  # [N, K] of the original weight
    packed: torch.Tensor  # uint8 [N, Kp / 2] (4-bit), [N, 3 Kp / 4] (6-bit), int8 [N, Kp] (8-bit)
    scales: torch.Tensor  # fp16 [N, Kp / group_size]
    minimums: torch.Tensor | None  # fp16 [N, Kp / group_size] (4 and 6 bits)
    # int32 [K]: stored column j holds input column columns[j], so that groups scattered over the input
    # (an act-order GPTQ checkpoint's) are contiguous as stored (W[:, columns] = the stored matrix); None: in order
    columns: torch.Tensor | None = None

    @property
    def padded_k(self) -> int:
        return self.scales.shape[1] * self.group_size

    @property
    def nbytes(self) -> int:
        extra = self.minimums.numel() * 2 if self.minimums is not None else 0
        extra += self.columns.numel() * self.columns.element_size() if self.columns is not None else 0
        return self.packed.numel() * self.packed.element_size() + self.scales.numel() * 2 + extra

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / (self.shape[0] * self.shape[1])


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = w.shape
    kp = -(-k // group_size) * group_size
    if kp != k:
        w = torch.nn.functional.pad(w, (0, kp - k))
    return w.reshape(n, kp // group_size, group_size)  # [N, G, group]


def _fake_quant(g: torch.Tensor, bits: int, lo: torch.Tensor, hi: torch.Tensor):
    """Quantize groups g [N, G, S] to the range [lo, hi] (asymmetric) or [-hi, hi] (8-bit symmetric)."""
    if bits == 8:
        scale = (hi / 127.0).clamp_min(1e-10).half().float()
        q = torch.round(g / scale[..., None]).clamp(-127, 127)
        return q, scale, None, q * scale[..., None]
    levels = 2**bits - 1
    scale = ((hi - lo) / levels).clamp_min(1e-10).half().float()
    minimum = lo.half().float()
    q = torch.round((g - minimum[..., None]) / scale[..., None]).clamp(0, levels)
    return q, scale, minimum, q * scale[..., None] + minimum[..., None]


def fitting_group(k: int, group_size: int) -> int:
    """The group actually used for K columns: group_size, or the largest power-of-two fraction of it (down to
    MIN_GROUP) that divides K, so that K = 576 stores 576 columns in groups of 64 instead of 640 padded ones.
    When none divides K, group_size with zero padding."""
    g = group_size
    while g >= MIN_GROUP:
        if k % g == 0:
            return g
        g //= 2
    return group_size


def stored_nbytes(shape: tuple[int, int], bits: int, group_size: int = 128) -> int:
    """The bytes quantize() stores for a weight of `shape` (codes, fp16 scales, fp16 minimums below 8 bits)."""
    n, k = shape
    group = fitting_group(k, group_size)
    kp = -(-k // group) * group
    groups = n * kp // group
    return n * kp * bits // 8 + groups * 2 * (1 if bits == 8 else 2)


def best_grid(g: torch.Tensor, bits: int, clip_search: bool = True):
    """Groups g [N, G, S] on the grid (of the CLIP_RATIOS candidates) with the least squared reconstruction
    error: codes [N, G, S], scale [N, G], minimum [N, G] (None at 8 bits)."""
    if bits == 8:
        base_lo, base_hi = None, g.abs().amax(-1)
    else:
        base_lo, base_hi = g.amin(-1), g.amax(-1)
    best = None
    for ratio in CLIP_RATIOS if clip_search else (1.0,):
        lo = base_lo * ratio if base_lo is not None else None
        q, scale, minimum, deq = _fake_quant(g, bits, lo, base_hi * ratio)
        err = (deq - g).pow(2).sum(-1)  # [N, G]
        if best is None:
            best = [err, q, scale, minimum]
            continue
        better = err < best[0]
        best[0] = torch.where(better, err, best[0])
        best[1] = torch.where(better[..., None], q, best[1])
        best[2] = torch.where(better, scale, best[2])
        if minimum is not None:
            best[3] = torch.where(better, minimum, best[3])
    return best[1], best[2], best[3]


def quantize(w: torch.Tensor, bits: int, group_size: int = 128, clip_search: bool = True) -> QuantizedTensor:
    """Quantize W [N, K] group-wise (see the module docstring); the group is fitting_group(K, group_size)."""
    assert bits in BITS, f"bits must be one of {BITS}"
    group_size = fitting_group(w.shape[1], group_size)
    q, scale, minimum = best_grid(_grouped(w.float(), group_size), bits, clip_search)
    n = w.shape[0]
    codes = q.reshape(n, -1)
    return QuantizedTensor(
        bits=bits,
        group_size=group_size,
        shape=(w.shape[0], w.shape[1]),
        packed=pack(codes, bits),
        scales=scale.half(),
        minimums=minimum.half() if minimum is not None else None,
    )


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [N, Kp] (float or int) -> packed storage (see the module docstring)."""
    if bits == 8:
        return codes.to(torch.int8)
    if bits == 4:  # (uint8 codes pair up as they are: a code is at most 15)
        c = codes if codes.dtype == torch.uint8 else codes.to(torch.int32)
        return (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8)
    c = codes.to(torch.int32)
    word = c[:, 0::4] | (c[:, 1::4] << 6) | (c[:, 2::4] << 12) | (c[:, 3::4] << 18)  # 24-bit words
    return (
        torch.stack([word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF], dim=-1).flatten(1).to(torch.uint8)
    )


def dequantize(qt: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [N, K] the quantized tensor stands for (the fused kernel's naive twin does the arithmetic)."""
    w = dequantize_weight(qt.packed, qt.scales, qt.minimums, qt.bits, qt.group_size, qt.shape[1], qt.columns)
    return w.to(dtype)
