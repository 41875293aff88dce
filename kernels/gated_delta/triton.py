"""The gated delta rule in Triton for packed variable-length sequences, in two forms with one result:

    q, k <- l2norm(q), l2norm(k);  q <- q / sqrt(Dk)
    S <- exp(g_t) S;  delta = beta_t (v_t - S^T k);  S <- S + k delta^T;  o_t = S^T q

* Recurrent (decode, short steps): one program per (sequence, value head, block of BLOCK_V value dims)
  holds its [Dk, BLOCK_V] slice of the fp32 state in registers and walks the sequence's tokens.
* Chunked (prefill): the tokens in chunks of CHUNK. Within a chunk starting from state S0, with gamma the
  cumulative log-decay from the chunk's start and the deltas D (rows = tokens),
      D = U - W S0,  U = T diag(beta) V,  W = T diag(beta e^gamma) K,  T = (I + A)^-1,
      A_ij = beta_i e^(gamma_i - gamma_j) k_i.k_j  (j < i),
      O = diag(e^gamma) Q S0 + (M o Q K^T) D,  M_ij = e^(gamma_i - gamma_j)  (j <= i),
      S = e^gamma_last S0 + K^T diag(e^(gamma_last - gamma)) D
  (S_i = e^gamma_i S0 + sum_{j<=i} e^(gamma_i - gamma_j) k_j d_j^T, unrolled). A first kernel builds W and
  U for every chunk and head at once (T by forward substitution on the unit lower-triangular I + A); a
  second walks each sequence's chunks in order per (value head, block of value dims), the products as
  tl.dot. No host sync in either: bounds come from cu_seqlens on the device, grids from T.

Layout: q, k [T, Hk, Dk] and v [T, Hv, Dv] with heads D apart and tokens any stride apart (views into the
conv output), g and beta [T, Hv], state [num_slots, Hv, Dk, Dv] fp32, out [T, Hv, Dv] in v's dtype. Value
head h reads key head h // (Hv / Hk). Slot -1 is padding: zero outputs, no state read or written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.triton_config import (
    dot_dtype,
    dot_precision,
    interpreting,
    pipeline_stages,
    shared_memory_per_block,
    sm_count,
)

CHUNK = 64  # tokens a chunk in the chunked form
# value dims a scan program takes where the narrow grid is past one wave (_scan_block_v)
WIDE_SCAN_BLOCK_V = 64
CHUNKED_MIN_TOKENS = 16  # the chunked form from this many tokens a sequence on average


@triton.jit
def _unit_rows(x_ptr, rows, mask, stride, head_offset, d, D, L2NORM: tl.constexpr):
    """Rows [CHUNK, BLOCK_K] of q or k in fp32, L2-normalised (as the twin: x / sqrt(sum x^2 + 1e-6))."""
    x = tl.load(
        x_ptr + rows[:, None] * stride + head_offset + d[None, :],
        mask=mask[:, None] & (d[None, :] < D),
        other=0.0,
    ).to(tl.float32)
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _state_slice(
    cu_seqlens_ptr, state_indices_ptr, state_ptr, Hv, Dk, Dv, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Program (sequence, value head, value block)'s token range, slot and fp32 state slice [BLOCK_K,
    BLOCK_V] with its pointers and mask. Padding (slot -1) reads slot 0; callers zero its outputs and write
    nothing back."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.load(cu_seqlens_ptr + b)
    end = tl.load(cu_seqlens_ptr + b + 1)
    slot = tl.load(state_indices_ptr + b).to(tl.int64)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    s_mask = (dk < Dk)[:, None] & (dv < Dv)[None, :]
    s_ptrs = state_ptr + ((tl.maximum(slot, 0) * Hv + h) * Dk + dk[:, None]) * Dv + dv[None, :]
    return start, end, slot, dk, dv, s_mask, s_ptrs, tl.load(s_ptrs, mask=s_mask, other=0.0)


@triton.jit
def _chunk_prepare_kernel(
    k_ptr,
    v_ptr,
    g_ptr,  # [T, Hv] fp32
    beta_ptr,  # [T, Hv]
    w_ptr,  # [T, Hv, Dk] out, in DOT_DTYPE (as the scan reads it)
    u_ptr,  # [T, Hv, Dv] out, likewise
    gamma_ptr,  # [T, Hv] fp32 out: cumulative log-decay from the chunk's start
    cu_seqlens_ptr,
    stride_k,
    stride_v,
    stride_g,
    stride_beta,
    Hv,
    Dk,
    Dv,
    REP: tl.constexpr,
    L2NORM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,  # >= Dv
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # operands of the products (fp32, or the model's half dtype on a GPU)
):
    b = tl.program_id(0)
    h = tl.program_id(2)
    end = tl.load(cu_seqlens_ptr + b + 1)
    start = tl.load(cu_seqlens_ptr + b) + tl.program_id(1) * CHUNK
    if start >= end:
        return
    i = tl.arange(0, CHUNK)
    rows = start + i
    mask = rows < end
    dk = tl.arange(0, BLOCK_K)
    dv = tl.arange(0, BLOCK_V)
    k = _unit_rows(k_ptr, rows, mask, stride_k, (h // REP) * Dk, dk, Dk, L2NORM)  # [CHUNK, BLOCK_K]
    v = tl.load(
        v_ptr + rows[:, None] * stride_v + h * Dv + dv[None, :],
        mask=mask[:, None] & (dv[None, :] < Dv),
        other=0.0,
    ).to(tl.float32)
    g = tl.load(g_ptr + rows * stride_g + h, mask=mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * stride_beta + h, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.cumsum(g, axis=0)
    tl.store(gamma_ptr + rows * Hv + h, gamma, mask=mask)
    # A (strictly lower): beta_i e^(gamma_i - gamma_j) k_i.k_j; padding rows have beta 0
    k_op = k.to(DOT_DTYPE)
    kk = tl.dot(k_op, tl.trans(k_op), input_precision=PRECISION)
    lower = i[None, :] < i[:, None]
    decay = tl.exp(tl.where(lower, gamma[:, None] - gamma[None, :], 0.0))
    a = tl.where(lower, beta[:, None] * decay * kk, 0.0)
    # T = (I + A)^-1 by forward substitution: row i = e_i - sum_{j<i} A_ij T_j
    t = tl.where(i[:, None] == i[None, :], 1.0, 0.0)
    for r in range(1, CHUNK):
        a_r = tl.sum(tl.where(i[:, None] == r, a, 0.0), axis=0)  # [CHUNK]: row r of A
        t = tl.where(i[:, None] == r, t - tl.sum(a_r[:, None] * t, axis=0)[None, :], t)
    t = t.to(DOT_DTYPE)
    w = tl.dot(t, ((beta * tl.exp(gamma))[:, None] * k).to(DOT_DTYPE), input_precision=PRECISION)
    u = tl.dot(t, (beta[:, None] * v).to(DOT_DTYPE), input_precision=PRECISION)
    out_rows = rows[:, None] * Hv + h
    w_mask = mask[:, None] & (dk[None, :] < Dk)
    tl.store(w_ptr + out_rows * Dk + dk[None, :], w.to(w_ptr.dtype.element_ty), mask=w_mask)
    u_mask = mask[:, None] & (dv[None, :] < Dv)
    tl.store(u_ptr + out_rows * Dv + dv[None, :], u.to(u_ptr.dtype.element_ty), mask=u_mask)


@triton.jit
def _chunk_scan_kernel(
    q_ptr,
    k_ptr,
    w_ptr,  # [T, Hv, Dk] in DOT_DTYPE
    u_ptr,  # [T, Hv, Dv] in DOT_DTYPE
    gamma_ptr,  # [T, Hv] fp32
    state_ptr,  # [num_slots, Hv, Dk, Dv] fp32
    out_ptr,  # [T, Hv, Dv]
    cu_seqlens_ptr,
    state_indices_ptr,
    stride_q,
    stride_k,
    Hv,
    Dk,
    Dv,
    scale,
    REP: tl.constexpr,
    L2NORM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    h = tl.program_id(1)
    kh = h // REP
    start, end, slot, dk, dv, s_mask, s_ptrs, s = _state_slice(
        cu_seqlens_ptr, state_indices_ptr, state_ptr, Hv, Dk, Dv, BLOCK_K, BLOCK_V
    )
    k_mask = dk < Dk
    v_mask = dv < Dv
    i = tl.arange(0, CHUNK)
    causal = i[None, :] <= i[:, None]
    for c0 in range(start, end, CHUNK):
        rows = c0 + i
        mask = rows < end
        q = (_unit_rows(q_ptr, rows, mask, stride_q, kh * Dk, dk, Dk, L2NORM) * scale).to(DOT_DTYPE)
        k = _unit_rows(k_ptr, rows, mask, stride_k, kh * Dk, dk, Dk, L2NORM).to(DOT_DTYPE)
        w = tl.load(
            w_ptr + (rows[:, None] * Hv + h) * Dk + dk[None, :],
            mask=mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        u = tl.load(
            u_ptr + (rows[:, None] * Hv + h) * Dv + dv[None, :],
            mask=mask[:, None] & v_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        gamma = tl.load(gamma_ptr + rows * Hv + h, mask=mask, other=0.0)
        gamma_last = tl.min(gamma, axis=0)  # non-increasing: the last valid row's (padding rows load 0)
        s_op = s.to(DOT_DTYPE)
        d = u - tl.dot(w, s_op, input_precision=PRECISION)  # [CHUNK, BLOCK_V] deltas, fp32
        d_op = d.to(DOT_DTYPE)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [CHUNK, CHUNK]
        m = tl.where(causal, tl.exp(tl.where(causal, gamma[:, None] - gamma[None, :], 0.0)), 0.0)
        o = tl.exp(gamma)[:, None] * tl.dot(q, s_op, input_precision=PRECISION)
        o += tl.dot((m * qk).to(DOT_DTYPE), d_op, input_precision=PRECISION)
        o = tl.where(slot >= 0, o, 0.0)
        out_ptrs = out_ptr + (rows[:, None] * Hv + h) * Dv + dv[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=mask[:, None] & v_mask[None, :])
        # (diag(e) K)^T D = K^T (diag(e) D): the decay on the [CHUNK, BLOCK_V] deltas, not the [CHUNK, Dk] keys,
        # so the keys stay in the operand dtype and the fp32 copy is not live across the chunk
        d_decayed = (tl.exp(gamma_last - gamma)[:, None] * d).to(DOT_DTYPE)
        s = tl.exp(gamma_last) * s + tl.dot(tl.trans(k), d_decayed, input_precision=PRECISION)
    if slot >= 0:
        tl.store(s_ptrs, s, mask=s_mask)


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
    h = tl.program_id(1)
    kh = h // REP
    start, end, slot, dk, dv, s_mask, s_ptrs, S = _state_slice(
        cu_seqlens_ptr, state_indices_ptr, state_ptr, Hv, Dk, Dv, BLOCK_K, BLOCK_V
    )
    k_mask = dk < Dk
    v_mask = dv < Dv
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
    chunked: bool | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """See kernels/gated_delta/naive.py. The chunked form when the step averages CHUNKED_MIN_TOKENS tokens a
    sequence or more (a host-side shape: no sync) and its products run on half-precision operands (a bf16 /
    fp16 model on a GPU; fp32 ones leave the scan one pipeline stage where two do not fit, _scan_stages) or
    under the interpreter; else the recurrent one. `chunked` forces one. block_v (value dims a program),
    num_warps and num_stages (the chunked scan's pipeline depth) are tuning knobs for benchmarks/gpu_kernels.py's sweep (defaults:
    recurrent 32 / 4 warps; chunked 32 / 8, three stages where they fit)."""
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
    operands = dot_dtype(v.dtype)  # the chunked form's product operands
    if chunked is None:
        half_operands = operands != tl.float32
        chunked = num_tokens >= CHUNKED_MIN_TOKENS * num_seqs and (half_operands or interpreting())
    if chunked:
        args = (q, k, v, g, beta, state, cu_seqlens, state_indices, use_qk_l2norm, out)
        tiles = dict(block_k=block_k, block_v=block_v, num_warps=num_warps, num_stages=num_stages)
        return _chunked(*args, operands=operands, **tiles)
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
        num_warps=num_warps or 4,
    )
    return out


def _chunked(
    q,
    k,
    v,
    g,
    beta,
    state,
    cu_seqlens,
    state_indices,
    use_qk_l2norm,
    out,
    *,
    operands,
    block_k,
    block_v,
    num_warps,
    num_stages,
):
    """The chunked form (module docstring): W, U and the cumulative decays of every chunk, then the scan."""
    num_tokens, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[1:]
    num_seqs = state_indices.shape[0]
    # W and U are stored as the products read them
    wu = dict(dtype=torch.float32 if operands == tl.float32 else v.dtype, device=v.device)
    w = torch.empty((num_tokens, num_v_heads, head_k_dim), **wu)
    u = torch.empty((num_tokens, num_v_heads, head_v_dim), **wu)
    gamma = torch.empty((num_tokens, num_v_heads), dtype=torch.float32, device=v.device)
    common = dict(
        REP=num_v_heads // num_k_heads,
        L2NORM=use_qk_l2norm,
        CHUNK=CHUNK,
        BLOCK_K=block_k,
        PRECISION=dot_precision(v.dtype),
        DOT_DTYPE=operands,
    )
    # NOTE: T bounds every sequence's chunk count, so the grid needs no device sync
    _chunk_prepare_kernel[(num_seqs, triton.cdiv(num_tokens, CHUNK), num_v_heads)](
        k,
        v,
        g,
        beta,
        w,
        u,
        gamma,
        cu_seqlens,
        k.stride(0),
        v.stride(0),
        g.stride(0),
        beta.stride(0),
        num_v_heads,
        head_k_dim,
        head_v_dim,
        BLOCK_V=max(16, triton.next_power_of_2(head_v_dim)),
        num_warps=8,
        **common,
    )
    size = 4 if operands == tl.float32 else 2
    block_v = block_v or _scan_block_v(num_seqs, num_v_heads, head_v_dim, block_k, size, v.device)
    stages = num_stages or _scan_stages(block_k, block_v, size, v.device)
    _chunk_scan_kernel[(num_seqs, num_v_heads, triton.cdiv(head_v_dim, block_v))](
        q,
        k,
        w,
        u,
        gamma,
        state,
        out,
        cu_seqlens,
        state_indices,
        q.stride(0),
        k.stride(0),
        num_v_heads,
        head_k_dim,
        head_v_dim,
        head_k_dim**-0.5,
        BLOCK_V=block_v,
        num_warps=num_warps or 8,
        num_stages=stages,
        **common,
    )
    return out


def _scan_stages(block_k: int, block_v: int, size: int, device) -> int:
    """The scan's pipeline depth: three stages where they fit, else two; fp32 operands (the chunked form
    forced on an fp32 model: tests, sweeps) two only where _fp32_two_stage_bytes fit (SM 9.0 / 10.0), else
    one (98 KB at Dk 128, BLOCK_V 32 under Triton 3.9: within every GPU's from SM 8.0 on)."""
    stages = pipeline_stages(_three_stage_bytes(block_k, block_v, size), device)
    if (
        stages == 2
        and size == 4
        and _fp32_two_stage_bytes(block_k, block_v) > shared_memory_per_block(device)
    ):
        return 1
    return stages


def _fp32_two_stage_bytes(block_k: int, block_v: int) -> int:
    """The scan's shared memory at two stages of fp32 operands: ~1.8 stages' tiles and the state operand
    (Triton 3.9 took 189,440 bytes at Dk 128, BLOCK_V 32: more than SM 8.0's 163 KB or a consumer GPU's 99)."""
    return 9 * CHUNK * (3 * block_k + block_v) * 4 // 5 + block_k * block_v * 4 + 8192


def _three_stage_bytes(block_k: int, block_v: int, size: int) -> int:
    """The scan's shared memory at three pipeline stages (operands of `size` bytes). A stage: [CHUNK, Dk]
    q / k / W tiles and a [CHUNK, BLOCK_V] U tile (52 KB at Dk 128, BLOCK_V 32, half operands; twice that
    in fp32); and the [Dk, BLOCK_V] state operand. Three half-precision stages fit SM 9.0 (156-185 KB at
    32 value dims, 190-206 at 64), not 99 KB consumer GPUs; fp32 operands take two stages on SM 9.0."""
    return 3 * CHUNK * (3 * block_k + block_v) * size + block_k * block_v * size + 8192


def _scan_block_v(num_seqs: int, num_v_heads: int, head_v_dim: int, block_k: int, size: int, device) -> int:
    """Value dims a scan program takes: 32 (16 for narrower heads); WIDE_SCAN_BLOCK_V where the 32-wide grid
    is more than one wave of the GPU (one program an SM: 255 registers a thread at 8 warps) and the wide one
    fits in one, and three stages of its tiles fit shared memory (SM 9.0, half-precision operands). Each
    program reads and multiplies its chunk's q, k and W whatever its width, so a wide program costs less
    than two narrow ones: an H200 scanned 4,096 tokens of Qwen3.5-27B's 48 value heads (one sequence: 192
    narrow programs, 96 wide) in 1.66 ms wide against 2.02 narrow (2026-12-04, Triton 3.6, though the wide
    tile spills 428-524 bytes); with 32 value heads the narrow grid is one wave already."""
    narrow = min(32, max(16, triton.next_power_of_2(head_v_dim)))
    wide = min(WIDE_SCAN_BLOCK_V, triton.next_power_of_2(head_v_dim))
    programs = num_seqs * num_v_heads
    sms = sm_count(device)
    if wide <= narrow or programs * triton.cdiv(head_v_dim, narrow) <= sms:
        return narrow
    fits = pipeline_stages(_three_stage_bytes(block_k, wide, size), device) == 3
    return wide if fits and programs * triton.cdiv(head_v_dim, wide) <= sms else narrow
