"""Mixture-of-experts MLP on the GPU: the tokens' expert assignments sorted by expert (moe_align: one kernel
for decode-sized steps, torch ops for prompts; no host sync, so decode steps can be captured as CUDA
graphs), then one grouped matmul kernel launched
twice: each program takes BLOCK_M assignments of one expert (its block of the sorted list) and BLOCK_N of
that expert's output rows, gathers the assignments' rows of x and streams the expert's weight, packed
(4 / 6 / 8-bit, engine/quant/groupwise.py's layout, dequantized a group at a time in registers) or dense.
gate_up per token, silu(gate) * up, down per assignment scaled by its routing weight, and the k outputs of
a token summed.

The sorted list is padded per expert to whole BLOCK_M blocks; its length is bounded by T k + E (BLOCK_M -
1), which sizes the grid without reading anything back: programs past the padded total exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.fp4_matmul.triton import weight_tile
from ninfer_kernels.fused_moe.naive import Fp4Experts, PackedExperts
from ninfer_kernels.silu_mul.triton import silu_mul
from ninfer_kernels.triton_codes import fp4_row_scales, unpack_codes
from ninfer_kernels.triton_config import dot_dtype, dot_precision

DENSE_BLOCK_K = 64  # K a step over dense experts


ALIGN_KERNEL_MAX = 128  # assignments (T k) up to which one program sorts them (decode steps, drafts too)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(sorted_ids int32 [S], block_expert int32 [S / block_m], num_padded int32 [1]): the assignments
    (t k + j) grouped by expert, each expert's group padded to whole blocks with T k (no assignment);
    block b belongs to expert block_expert[b] (past num_padded: the last expert); num_padded blocks' worth
    of entries are used. No host sync. Up to ALIGN_KERNEL_MAX assignments one kernel (_align_kernel) sorts
    them, where the torch ops below are some twenty launches (each a graph node of a decode step)."""
    if topk_ids.numel() <= ALIGN_KERNEL_MAX:
        return _align_small(topk_ids, num_experts, block_m)
    return _align_torch(topk_ids, num_experts, block_m)


def _align_size(n: int, num_experts: int, block_m: int) -> int:
    """The sorted list's length: T k assignments and at most block_m - 1 padding entries per expert."""
    return triton.cdiv(n + num_experts * (block_m - 1), block_m) * block_m


def _align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    flat = topk_ids.reshape(-1).to(torch.int64)
    n, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    rank = torch.arange(n, device=device) - (torch.cumsum(counts, 0) - counts)[expert]
    size = _align_size(n, num_experts, block_m)
    sorted_ids = torch.full((size,), n, dtype=torch.int32, device=device)
    sorted_ids[(ends - padded)[expert] + rank] = order.to(torch.int32)
    starts = torch.arange(0, size, block_m, device=device)
    block_expert = torch.searchsorted(ends, starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


def _align_small(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    flat = topk_ids.reshape(-1)
    n, device = flat.numel(), flat.device
    size = _align_size(n, num_experts, block_m)
    sorted_ids = torch.empty(size, dtype=torch.int32, device=device)
    block_expert = torch.empty(size // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    _align_kernel[(1,)](
        flat,
        sorted_ids,
        block_expert,
        num_padded,
        n,
        size,
        num_experts,
        BLOCK_M=block_m,
        BLOCK_N=max(16, triton.next_power_of_2(n)),
        BLOCK_E=64,
        BLOCK_FILL=1024,
    )
    return sorted_ids, block_expert, num_padded


@triton.jit
def _align_kernel(
    ids_ptr,  # [n] expert of each assignment
    sorted_ptr,  # [size] int32 out
    block_expert_ptr,  # [size / BLOCK_M] int32 out
    num_padded_ptr,  # [1] int32 out
    n,
    size,
    E,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= n
    BLOCK_E: tl.constexpr,  # experts counted a step
    BLOCK_FILL: tl.constexpr,
):
    """_align_torch's result in one program: each assignment's place is its expert's first padded slot
    (the padded counts of the experts before it) plus its rank among the same expert's assignments (stable:
    those before it); each used block takes the expert of the assignments in it (every block of an expert
    holds at least one: only the last is padded)."""
    i = tl.arange(0, BLOCK_N)
    live = i < n
    ids = tl.load(ids_ptr + i, mask=live, other=-1).to(tl.int32)
    before = (ids[:, None] == ids[None, :]) & (i[None, :] < i[:, None])
    rank = tl.sum(before.to(tl.int32), axis=1)
    first = tl.zeros([BLOCK_N], tl.int32)  # each assignment's expert's first slot
    total = 0
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        hit = ids[:, None] == e[None, :]  # [BLOCK_N, BLOCK_E]; padding lanes (-1) hit nothing
        padded = (tl.sum(hit.to(tl.int32), axis=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        starts = total + tl.cumsum(padded, axis=0) - padded
        first += tl.sum(tl.where(hit, starts[None, :], 0), axis=1)
        total += tl.sum(padded, axis=0)
    # no assignment and the last expert everywhere, then each assignment's own entries over them
    f = tl.arange(0, BLOCK_FILL)
    blocks = size // BLOCK_M
    for s0 in range(0, size, BLOCK_FILL):
        tl.store(sorted_ptr + s0 + f, tl.full([BLOCK_FILL], 0, tl.int32) + n, mask=s0 + f < size)
        tl.store(block_expert_ptr + s0 + f, tl.full([BLOCK_FILL], 0, tl.int32) + E - 1, mask=s0 + f < blocks)
    tl.debug_barrier()
    slot = first + rank
    tl.store(sorted_ptr + slot, i, mask=live)
    tl.store(block_expert_ptr + slot // BLOCK_M, ids, mask=live)
    tl.store(num_padded_ptr, total)


@triton.jit
def _moe_matmul_kernel(
    x_ptr,  # [rows, K]: tokens (X_PER_TOKEN) or assignments
    w_ptr,  # the experts: dense [E, N, K], or packed [E, N, ...] (6-bit read as int32)
    scales_ptr,  # fp16 [E, N, G] (packed)
    mins_ptr,  # fp16 [E, N, G] (packed, HAS_MINS)
    out_ptr,  # [T k, N]: one row per assignment
    sorted_ids_ptr,
    block_expert_ptr,
    num_padded_ptr,
    weights_ptr,  # fp32 [T k]: routing weights (MUL_WEIGHTS)
    columns_ptr,  # int32 [E, K]: the input column of each stored one (HAS_COLUMNS: act-order experts)
    num_assignments,
    N,
    K,
    KP,
    stride_xm,
    stride_we,  # elements of w_ptr's type an expert
    num_groups,
    TOPK: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    MUL_WEIGHTS: tl.constexpr,
    BITS: tl.constexpr,  # 4 / 6 / 8: packed; 16: dense
    FP4: tl.constexpr,  # an FP4 checkpoint's codes (uint8 [E, N, K / 2]; mins_ptr: fp32 [E, N] multipliers)
    E8M0: tl.constexpr,  # (FP4) MXFP4's scales, else NVFP4's e4m3
    GROUP_SIZE: tl.constexpr,  # packed: the weight's group; dense: K a step
    HAS_MINS: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M] assignments
    valid = ids < num_assignments
    rows = ids // TOPK if X_PER_TOKEN else ids
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_base = w_ptr + expert * stride_we
    if FP4:  # (rows past N read the last row again, never stored; their multipliers at mins_ptr)
        rows_in = tl.minimum(offs_n, N - 1)
        row_scale = fp4_row_scales(mins_ptr + expert * N, rows_in, E8M0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, KP, GROUP_SIZE):
        kk = k0 + tl.arange(0, GROUP_SIZE)
        if HAS_COLUMNS:  # x's columns gathered in the expert's stored order
            xk = tl.load(columns_ptr + expert * K + kk, mask=kk < K, other=0)
        else:
            xk = kk
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + xk[None, :],
            mask=valid[:, None] & (kk < K)[None, :],
            other=0.0,
        )
        if BITS == 16:
            w = tl.load(
                w_base + offs_n[:, None] * K + kk[None, :],
                mask=n_mask[:, None] & (kk < K)[None, :],
                other=0.0,
            )
        elif FP4:  # the group's e2m1 codes times its scale and the row's multiplier, in fp32
            w = weight_tile(
                w_base,
                scales_ptr + expert * N * num_groups,
                rows_in,
                row_scale,
                k0,
                KP // 2,
                num_groups,
                GROUP_SIZE,
                E8M0,
                BLOCK_N,
                GROUP_SIZE,
            )
        else:  # the group's codes, scaled (and shifted) per row in fp32
            codes = unpack_codes(w_base, offs_n, n_mask, k0, KP, BITS, BLOCK_N, GROUP_SIZE)
            g = (expert * N + offs_n) * num_groups + k0 // GROUP_SIZE
            w = codes.to(tl.float32) * tl.load(scales_ptr + g, mask=n_mask, other=0.0).to(tl.float32)[:, None]
            if HAS_MINS:
                w += tl.load(mins_ptr + g, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        acc += tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), input_precision=PRECISION)
    if MUL_WEIGHTS:
        acc *= tl.load(weights_ptr + ids, mask=valid, other=0.0)[:, None]
    mask = valid[:, None] & n_mask[None, :]
    tl.store(
        out_ptr + ids[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask
    )


def _moe_matmul(x, experts, out, align, topk, x_per_token, weights, block_m, block_n):
    sorted_ids, block_expert, num_padded = align
    _, n, k = experts.shape
    fp4 = isinstance(experts, Fp4Experts)
    if fp4:  # (the multipliers where the minimums go; K a multiple of the group)
        w, bits, group, scales, mins = (
            experts.packed,
            4,
            experts.group_size,
            experts.scale_codes,
            experts.multiplier,
        )
        kp, columns = k, None
    elif isinstance(experts, PackedExperts):
        w = experts.packed.view(torch.int32) if experts.bits == 6 else experts.packed
        bits, group, scales, mins = experts.bits, experts.group_size, experts.scales, experts.minimums
        kp, columns = scales.shape[2] * group, experts.columns
    else:
        w, bits, group, scales, mins, columns = experts, 16, DENSE_BLOCK_K, experts, None, None
        kp = triton.cdiv(k, group) * group
    assert w.is_contiguous() and x.stride(1) == 1 and x.shape[1] == k
    grid = (sorted_ids.numel() // block_m, triton.cdiv(n, block_n))
    _moe_matmul_kernel[grid](
        x,
        w,
        scales,
        mins if mins is not None else scales,
        out,
        sorted_ids,
        block_expert,
        num_padded,
        weights if weights is not None else scales,
        columns if columns is not None else scales,
        out.shape[0],
        n,
        k,
        kp,
        x.stride(0),
        w.stride(0),
        kp // group,
        TOPK=topk,
        X_PER_TOKEN=x_per_token,
        MUL_WEIGHTS=weights is not None,
        BITS=bits,
        FP4=fp4,
        E8M0=fp4 and experts.e8m0,
        GROUP_SIZE=group,
        HAS_MINS=mins is not None and not fp4,
        HAS_COLUMNS=columns is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PRECISION=dot_precision(x.dtype),
        DOT_DTYPE=dot_dtype(x.dtype),
    )
    return out


def fused_moe(
    x: torch.Tensor,
    gate_up: torch.Tensor | PackedExperts | Fp4Experts,
    down: torch.Tensor | PackedExperts | Fp4Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    block_m: int | None = None,
    block_n: int = 64,
) -> torch.Tensor:
    """See kernels/fused_moe/naive.py. block_m (assignments a program: 16 for decode-sized steps, 64 from
    64 assignments on) and block_n are tuning knobs."""
    num_tokens, topk = topk_ids.shape
    num_experts, inter2, _ = gate_up.shape  # inter2: the gate and up rows
    n = num_tokens * topk
    block_m = block_m or (16 if n < 64 else 64)
    align = moe_align(topk_ids, num_experts, block_m)
    h = _moe_matmul(x, gate_up, x.new_empty((n, inter2)), align, topk, True, None, block_m, block_n)
    a = silu_mul(h)  # [T k, I]
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    y = _moe_matmul(a, down, x.new_empty((n, x.shape[1])), align, topk, False, weights, block_m, block_n)
    return y.view(num_tokens, topk, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
