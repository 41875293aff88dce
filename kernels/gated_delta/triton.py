"""The gated delta rule in Triton, the recurrent form, for packed variable-length sequences.

One program per (sequence, value head, block of BLOCK_V value dims) holds its [Dk, BLOCK_V] slice of the
fp32 state in registers and walks the sequence's tokens (bounds from cu_seqlens on the device, so no host
sync and a CUDA graph can hold it):
    q, k <- l2norm(q), l2norm(k);  q <- q / sqrt(Dk)
    S <- exp(g_t) S;  delta = beta_t (v_t - S^T k);  S <- S + k delta^T;  o_t = S^T q
then writes the slice back. Decode (one token a sequence) reads and writes each state once; a prefill
chunk runs its tokens in order inside each program (the chunked form, which turns a chunk into matmuls,
is not written yet).

Layout: q, k [T, Hk, Dk] and v [T, Hv, Dv] with heads D apart and tokens any stride apart (views into the
conv output), g and beta [T, Hv], state [num_slots, Hv, Dk, Dv] fp32, out [T, Hv, Dv] in v's dtype. Value
head h reads key head h // (Hv / Hk). Slot -1 is padding: zero outputs, no state read or written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_delta_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,  # [T, Hv] fp32
    beta_ptr,  # [T, Hv]
    state_ptr,  # [num_slots, Hv, Dk, Dv] fp32
    out_ptr,  # [T, Hv, Dv]
    cu_seqlens_ptr,  # [B + 1] int32
    state_indices_ptr,  # [B] int32
    stride_q,
    stride_k,
    stride_v,
    stride_g,
    stride_beta,
    Hv,
    Dk,
    Dv,
    scale,
    REP: tl.constexpr,  # Hv / Hk
    L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,  # >= Dk
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kh = h // REP
    start = tl.load(cu_seqlens_ptr + b)
    end = tl.load(cu_seqlens_ptr + b + 1)
    slot = tl.load(state_indices_ptr + b).to(tl.int64)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask = dk < Dk
    v_mask = dv < Dv
    s_mask = k_mask[:, None] & v_mask[None, :]
    # padding (slot -1) reads slot 0, zeroes its outputs and writes nothing back
    s_ptrs = state_ptr + ((tl.maximum(slot, 0) * Hv + h) * Dk + dk[:, None]) * Dv + dv[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)  # [BLOCK_K, BLOCK_V] fp32
    for t in range(start, end):
        q = tl.load(q_ptr + t * stride_q + kh * Dk + dk, mask=k_mask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_k + kh * Dk + dk, mask=k_mask, other=0.0).to(tl.float32)
        if L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        q = q * scale
        v = tl.load(v_ptr + t * stride_v + h * Dv + dv, mask=v_mask, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + t * stride_g + h).to(tl.float32))
        beta = tl.load(beta_ptr + t * stride_beta + h).to(tl.float32)
        S = S * decay
        delta = (v - tl.sum(S * k[:, None], axis=0)) * beta  # [BLOCK_V]
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        o = tl.where(slot >= 0, o, 0.0)
        tl.store(out_ptr + (t * Hv + h) * Dv + dv, o.to(out_ptr.dtype.element_ty), mask=v_mask)
    if slot >= 0:
        tl.store(s_ptrs, S, mask=s_mask)


def gated_delta_rule(
    q: torch.Tensor,  # [T, Hk, Dk]
    k: torch.Tensor,  # [T, Hk, Dk]
    v: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] fp32 log-decay
    beta: torch.Tensor,  # [T, Hv]
    state: torch.Tensor,  # [num_slots, Hv, Dk, Dv] fp32
    cu_seqlens: torch.Tensor,  # [B + 1] int32
    state_indices: torch.Tensor,  # [B] int32
    use_qk_l2norm: bool = True,
    *,
    block_v: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """See kernels/gated_delta/naive.py. block_v (value dims a program) and num_warps are tuning knobs for
    benchmarks/gpu_kernels.py's sweep."""
    num_tokens, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[1:]
    for x, d in ((q, head_k_dim), (k, head_k_dim), (v, head_v_dim)):
        assert x.stride(2) == 1 and x.stride(1) == d, "q / k / v need heads packed, dims contiguous"
    assert state.dtype == torch.float32 and state.is_contiguous() and g.stride(1) == 1 and beta.stride(1) == 1
    assert num_v_heads % num_k_heads == 0
    out = torch.empty((num_tokens, num_v_heads, head_v_dim), dtype=v.dtype, device=v.device)
    num_seqs = state_indices.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_k = triton.next_power_of_2(head_k_dim)
    # a [Dk, BLOCK_V] fp32 state slice per program: 32 registers a thread at Dk 128
    block_v = block_v or min(triton.next_power_of_2(head_v_dim), max(16, 4096 // block_k))
    grid = (num_seqs, num_v_heads, triton.cdiv(head_v_dim, block_v))
    _gated_delta_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        state,
        out,
        cu_seqlens,
        state_indices,
        q.stride(0),
        k.stride(0),
        v.stride(0),
        g.stride(0),
        beta.stride(0),
        num_v_heads,
        head_k_dim,
        head_v_dim,
        head_k_dim**-0.5,
        REP=num_v_heads // num_k_heads,
        L2NORM=use_qk_l2norm,
        BLOCK_K=block_k,
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return out
