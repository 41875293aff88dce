"""Depthwise causal conv1d (+ SiLU) over packed variable-length sequences, continuing from each sequence's
conv state, in two launches: the outputs (every token in parallel: token t reads its K inputs t - K + 1 ..
t, those before its sequence's start from the state), then the state update (the last K - 1 inputs of
each sequence), so no program overwrites a state another still reads. No host sync: sequence bounds come
from cu_seqlens on the device, and the grid from T.

Layout: x [T, C] rows any stride apart (a view into the fused input projection), weight [C, K], conv_state
[num_slots, C, K - 1] (oldest input first), out [T, C] contiguous in x's dtype. Slot -1 is padding: zero
outputs, no state read or written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv1d_kernel(
    x_ptr,  # [T, C]
    weight_ptr,  # [C, K]
    state_ptr,  # [num_slots, C, K - 1]
    out_ptr,  # [T, C]
    cu_seqlens_ptr,  # [B + 1] int32
    state_indices_ptr,  # [B] int32
    stride_x,
    C,
    K: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + b)
    end = tl.load(cu_seqlens_ptr + b + 1)
    t0 = start + tl.program_id(1) * BLOCK_T
    if t0 >= end:
        return
    slot = tl.load(state_indices_ptr + b).to(tl.int64)
    read_slot = tl.maximum(slot, 0)  # padding (-1) reads slot 0 and zeroes its outputs below
    t = t0 + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BLOCK_C]
    t_mask = t < end
    c_mask = c < C
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    for j in tl.static_range(K):
        src = t - (K - 1) + j  # the input this tap reads
        in_seq = src >= start
        x = tl.load(
            x_ptr + src[:, None] * stride_x + c[None, :],
            mask=(in_seq & t_mask)[:, None] & c_mask[None, :],
            other=0.0,
        )
        # before the sequence's start: state entry K - 1 + (src - start); as the twin, in x's dtype
        from_state = (~in_seq & t_mask)[:, None] & c_mask[None, :]
        s = tl.load(
            state_ptr + (read_slot * C + c[None, :]) * (K - 1) + (K - 1 + src - start)[:, None],
            mask=from_state,
            other=0.0,
        )
        val = tl.where(in_seq[:, None], x.to(tl.float32), s.to(x_ptr.dtype.element_ty).to(tl.float32))
        w = tl.load(weight_ptr + c * K + j, mask=c_mask, other=0.0).to(tl.float32)
        acc += val * w[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(slot >= 0, acc, 0.0)
    mask = t_mask[:, None] & c_mask[None, :]
    tl.store(out_ptr + t[:, None] * C + c[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _conv_state_kernel(
    x_ptr,
    state_ptr,
    cu_seqlens_ptr,
    state_indices_ptr,
    stride_x,
    C,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,  # >= K - 1
    BLOCK_C: tl.constexpr,
):
    """state[slot] <- the last K - 1 inputs of (state, the sequence's new tokens)."""
    b = tl.program_id(0)
    slot = tl.load(state_indices_ptr + b).to(tl.int64)
    start = tl.load(cu_seqlens_ptr + b)
    length = tl.load(cu_seqlens_ptr + b + 1) - start
    if (slot < 0) | (length == 0):
        return
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]  # [BLOCK_C, 1]
    i = tl.arange(0, BLOCK_K)[None, :]  # [1, BLOCK_K]: entry of the new state
    mask = (c < C) & (i < K - 1)
    rel = length - (K - 1) + i  # position of that input within the sequence (< 0: in the old state)
    from_x = rel >= 0
    x = tl.load(x_ptr + (start + rel) * stride_x + c, mask=mask & from_x, other=0.0)
    base = state_ptr + (slot * C + c) * (K - 1)
    old = tl.load(base + K - 1 + rel, mask=mask & ~from_x, other=0.0)
    # as the twin: old entries pass through x's dtype
    new = tl.where(from_x, x.to(state_ptr.dtype.element_ty), old.to(x_ptr.dtype.element_ty).to(old.dtype))
    tl.store(base + i, new, mask=mask)


def causal_conv1d(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, K]
    conv_state: torch.Tensor,  # [num_slots, C, K - 1]
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    state_indices: torch.Tensor,  # [B] int32
    apply_silu: bool = True,
) -> torch.Tensor:
    """See kernels/conv1d/naive.py."""
    num_tokens, channels = x.shape
    kernel = weight.shape[1]
    assert x.stride(1) == 1 and weight.is_contiguous() and conv_state.is_contiguous()
    assert conv_state.shape[1:] == (channels, kernel - 1) and kernel >= 2
    out = torch.empty((num_tokens, channels), dtype=x.dtype, device=x.device)
    num_seqs = state_indices.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_c = 128
    # NOTE: T bounds every sequence's length, so the grid needs no device sync
    block_t = 16 if num_tokens > num_seqs else 1
    grid = (num_seqs, triton.cdiv(num_tokens, block_t), triton.cdiv(channels, block_c))
    _conv1d_kernel[grid](
        x,
        weight,
        conv_state,
        out,
        cu_seqlens,
        state_indices,
        x.stride(0),
        channels,
        K=kernel,
        SILU=apply_silu,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
    )
    _conv_state_kernel[(num_seqs, triton.cdiv(channels, block_c))](
        x,
        conv_state,
        cu_seqlens,
        state_indices,
        x.stride(0),
        channels,
        K=kernel,
        BLOCK_K=triton.next_power_of_2(kernel - 1),
        BLOCK_C=block_c,
    )
    return out
