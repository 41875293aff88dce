"""Rotary embedding, NeoX layout, partial rotary: one program per token, all q and k heads at once."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src,
    dst,
    t,
    stride_t,
    stride_h,
    num_heads,
    D,
    HALF,
    cos,
    sin,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    hm = h < num_heads
    jm = hm & (j < HALF)
    base = t * stride_t + h * stride_h
    out_base = (t * num_heads + h) * D
    # pass-through dims (partial rotary) are copied as they are
    rest = hm & (d >= 2 * HALF) & (d < D)
    tl.store(dst + out_base + d, tl.load(src + base + d, mask=rest, other=0.0), mask=rest)
    x1 = tl.load(src + base + j, mask=jm, other=0.0).to(tl.float32)
    x2 = tl.load(src + base + HALF + j, mask=jm, other=0.0).to(tl.float32)
    tl.store(dst + out_base + j, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=jm)
    tl.store(dst + out_base + HALF + j, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=jm)


@triton.jit
def _rope_kernel(
    q_ptr,  # [T, Hq, D] in
    k_ptr,  # [T, Hk, D] in
    q_out_ptr,  # [T, Hq, D] out
    k_out_ptr,  # [T, Hk, D] out
    positions_ptr,  # [T] int64
    cache_ptr,  # [max_pos, R] fp32: cos | sin
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    Hq,
    Hk,
    D,
    HALF,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(positions_ptr + t)
    j = tl.arange(0, BLOCK_HALF)
    jm = j < HALF
    cos = tl.load(cache_ptr + pos * 2 * HALF + j, mask=jm, other=1.0)[None, :]
    sin = tl.load(cache_ptr + pos * 2 * HALF + HALF + j, mask=jm, other=0.0)[None, :]
    _rotate_heads(
        q_ptr, q_out_ptr, t, stride_qt, stride_qh, Hq, D, HALF, cos, sin, BLOCK_H, BLOCK_HALF, BLOCK_D
    )
    _rotate_heads(
        k_ptr, k_out_ptr, t, stride_kt, stride_kh, Hk, D, HALF, cos, sin, BLOCK_H, BLOCK_HALF, BLOCK_D
    )


def rope(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hk, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, R] fp32
) -> tuple[torch.Tensor, torch.Tensor]:
    """See kernels/rope/naive.py. Returns new q, k (contiguous)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.is_contiguous()
    half = cos_sin_cache.shape[1] // 2
    q_out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((num_tokens, num_k_heads, head_dim), dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    _rope_kernel[(num_tokens,)](
        q,
        k,
        q_out,
        k_out,
        positions,
        cos_sin_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        num_q_heads,
        num_k_heads,
        head_dim,
        half,
        BLOCK_H=triton.next_power_of_2(max(num_q_heads, num_k_heads)),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
    return q_out, k_out
