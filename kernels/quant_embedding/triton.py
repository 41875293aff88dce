"""Rows of a group-wise quantized embedding table, dequantized on lookup (so the table stays packed on the
GPU). One program per (token, block of columns); the codes are gathered per column from the packed row:
4-bit two a byte (even column low), 6-bit four a little-endian 24-bit word, 8-bit signed bytes;
w = q * scale (+ minimum), one fp16 scale (and minimum) per group of columns."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _quant_embedding_kernel(
    ids_ptr,  # [T] int64
    packed_ptr,  # [V, row_bytes]
    scales_ptr,  # [V, G] fp16
    mins_ptr,  # [V, G] fp16 (or scales when there are none)
    out_ptr,  # [T, D]
    D,
    row_bytes,
    num_groups,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < D
    row = tl.load(ids_ptr + t).to(tl.int64)
    base = packed_ptr + row * row_bytes
    if BITS == 4:
        byte = tl.load(base + cols // 2, mask=mask, other=0).to(tl.int32)
        code = (byte >> ((cols % 2) * 4)) & 15
    elif BITS == 6:
        word_ptr = base + (cols // 4) * 3
        word = tl.load(word_ptr, mask=mask, other=0).to(tl.int32)
        word |= tl.load(word_ptr + 1, mask=mask, other=0).to(tl.int32) << 8
        word |= tl.load(word_ptr + 2, mask=mask, other=0).to(tl.int32) << 16
        code = (word >> ((cols % 4) * 6)) & 63
    else:
        code = tl.load(base + cols, mask=mask, other=0).to(tl.int32)  # signed bytes
    group = row * num_groups + cols // GROUP_SIZE
    w = code.to(tl.float32) * tl.load(scales_ptr + group, mask=mask, other=0.0).to(tl.float32)
    if HAS_MINS:
        w += tl.load(mins_ptr + group, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * D + cols, w.to(out_ptr.dtype.element_ty), mask=mask)


def quant_embedding(
    ids: torch.Tensor,  # [T] int64
    packed: torch.Tensor,
    scales: torch.Tensor,
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    dim: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """See kernels/quant_embedding/naive.py."""
    assert bits in (4, 6, 8) and packed.is_contiguous() and scales.is_contiguous()
    ids = ids.reshape(-1)
    out = torch.empty((ids.shape[0], dim), dtype=dtype, device=packed.device)
    if ids.shape[0] == 0:
        return out
    block_d = min(1024, triton.next_power_of_2(dim))
    _quant_embedding_kernel[(ids.shape[0], triton.cdiv(dim, block_d))](
        ids,
        packed,
        scales,
        minimums if minimums is not None else scales,
        out,
        dim,
        packed.shape[1],
        scales.shape[1],
        BITS=bits,
        GROUP_SIZE=group_size,
        HAS_MINS=minimums is not None,
        BLOCK_D=block_d,
    )
    return out
