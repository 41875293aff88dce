"""FP4 weight matmul: e2m1 codes with e4m3 (NVFP4) or e8m0 (MXFP4) group scales, decoded in the loads.

A code becomes a float by bit operations, no table (kernels/triton_codes.py: e2m1_codes, e2m1_pairs,
fp4_scales): e2m1 x 2^-14 and e4m3 x 2^-8 as fp16 bit placements, e8m0 as an fp32 exponent; the powers of
two are paid once a row, in the row's fp32 multiplier (fp4_row_scales), so every weight is e2m1 x scale x
multiplier rounded once, in fp32.

Shapes (a row read as int32 words of eight codes, K a multiple of 8; otherwise every M dequantizes):
* M = 1: the CUDA-core GEMV (gemv.py);
* 2..GEMV_MAX_M rows (draft verification, a few sequences): eight tensor-core products a STEP, one per code
  position j of the words (x's columns 8t + j against code j of word t), each code scaled in fp32 before
  it becomes a half-precision operand;
  both split-K as quant_matmul's GEMVs are (gemv_splits, split_buffers, split_k_store): one kernel a GEMV;
* GEMV_MAX_M + 1 .. DEQUANT_MIN_M - 1 rows (a batch's decode with drafts): the same tile kernel over
  16-row blocks of x, each program K whole (no split);
* DEQUANT_MIN_M+ rows (prompt chunks): the weight dequantized into the scratch a slice of rows at a time
  (weight_tile), multiplied by cuBLAS (kernels/quant_matmul/dequant.sliced_matmul), as the integer formats'
  long prefill chunks are.

Not yet timed on a GPU (benchmarks/gpu_kernels.py's quantized_matmul section has the rows); the
instruction counts of docs/kernels.md are the compile check's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer_kernels.fp4_matmul import DEQUANT_MIN_M, GEMV_MAX_M, GROUPS, STEP
from ninfer_kernels.fp4_matmul.gemv import _scales, fp4_gemv_cuda_cores_kernel, step_words
from ninfer_kernels.quant_matmul.dequant import sliced_matmul
from ninfer_kernels.quant_matmul.gemv4 import _rows_and_slice, split_eight
from ninfer_kernels.quant_matmul.split_k import split_k_store
from ninfer_kernels.quant_matmul.triton import gemv_splits, split_buffers
from ninfer_kernels.triton_codes import e2m1_codes, e2m1_pairs, fp4_row_scales, fp4_scales
from ninfer_kernels.triton_config import dot_dtype, dot_precision

GEMV_BLOCK_N = 128  # weight rows a GEMV program at M = 1
TILE_GEMV_BLOCK_N = 64  # at M = 2..16 (the decoded tile goes through the tensor cores)
DEQUANT_BLOCK_N = 32  # weight rows a dequantization program
COLUMNS = tl.constexpr(STEP)  # (STEP, as the kernels read it)


@triton.jit
def weight_tile(
    packed_ptr,  # uint8 [N, K / 2]
    scales_ptr,  # uint8 [N, G]
    rows,  # [BLOCK_N] weight rows (in bounds)
    row_scale,  # [BLOCK_N] fp32: the rows' multipliers with the codes' powers of two (fp4_row_scales)
    k0,
    row_bytes,  # K / 2
    num_groups,
    GROUP_SIZE: tl.constexpr,
    E8M0: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COLS: tl.constexpr,  # whole groups
):
    """W[rows, k0 : k0 + COLS] in fp32 ([BLOCK_N, COLS]; columns past K are 0), the codes unpacked in column
    order (the dequantized slices here; kernels/fused_moe's FP4 experts a group at a time)."""
    j = k0 // 2 + tl.arange(0, COLS // 2)
    p = tl.load(packed_ptr + rows[:, None] * row_bytes + j[None, :], mask=(j < row_bytes)[None, :], other=0)
    p = p.to(tl.int32)
    codes = tl.reshape(tl.join(e2m1_codes(p & 15), e2m1_codes(p >> 4)), (BLOCK_N, COLS))  # 2j: low nibble
    GROUPS_A_STEP: tl.constexpr = COLS // GROUP_SIZE
    g = k0 // GROUP_SIZE + tl.arange(0, GROUPS_A_STEP)
    s = tl.load(scales_ptr + rows[:, None] * num_groups + g[None, :], mask=(g < num_groups)[None, :], other=0)
    scale = fp4_scales(s.to(tl.int32), E8M0) * row_scale[:, None]  # [BLOCK_N, GROUPS_A_STEP]
    w = tl.reshape(codes, (BLOCK_N, GROUPS_A_STEP, GROUP_SIZE)) * scale[:, :, None]
    return tl.reshape(w, (BLOCK_N, COLS))


@triton.jit
def _pair_product(
    acc,
    xa,
    xb,
    word,
    scale,
    MAG: tl.constexpr,
    SIGN: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """acc + xa @ W_a^T + xb @ W_b^T over codes j and j + 4 of each word (e2m1_pairs' shifts), each weight
    scaled in fp32 before it becomes an operand."""
    ca, cb = e2m1_pairs(word, MAG, SIGN)
    acc = tl.dot(xa, tl.trans((ca * scale).to(DOT_DTYPE)), acc, input_precision=PRECISION)
    return tl.dot(xb, tl.trans((cb * scale).to(DOT_DTYPE)), acc, input_precision=PRECISION)


@triton.jit
def _fp4_gemv_kernel(
    x_ptr,  # [M, K]
    packed_ptr,  # int32 [N, K / 8]: eight codes a word
    scales_ptr,  # uint8 [N, G]
    mult_ptr,  # fp32 [N]
    out_ptr,  # [M, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 [GEMV_MAX_M * N] partial sums, zero before and after
    arrivals_ptr,  # SPLIT_K: int32 per output tile, zero before and after
    M,
    N,
    K,
    row_words,
    num_groups,
    stride_xm,
    stride_om,
    STEPS_PER_SPLIT,
    GROUP_SIZE: tl.constexpr,
    E8M0: tl.constexpr,
    EVEN_K: tl.constexpr,  # K a multiple of STEP
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """2-16 rows of x: per step, eight tensor-core products of K = STEP / 8, one per code position j of the
    words (x's columns 8t + j against code j of word t): the codes are never interleaved back into column
    order."""
    WORDS: tl.constexpr = COLUMNS // 8
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_n, n_mask, rows_in, k_start, k_end = _rows_and_slice(N, K, STEPS_PER_SPLIT, COLUMNS, BLOCK_N)
    row_scale = fp4_row_scales(mult_ptr, rows_in, E8M0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, COLUMNS):
        word = step_words(packed_ptr, rows_in, row_words, k0, WORDS, EVEN_K)
        scale = (
            _scales(scales_ptr, rows_in, num_groups, k0, WORDS, GROUP_SIZE, E8M0, EVEN_K) * row_scale[:, None]
        )
        kk = k0 + tl.arange(0, COLUMNS)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :],
            mask=m_mask[:, None] & (kk < K)[None, :],
            other=0.0,
        )
        x0, x1, x2, x3, x4, x5, x6, x7 = split_eight(tl.reshape(x.to(DOT_DTYPE), [BLOCK_M, WORDS, 2, 2, 2]))
        acc = _pair_product(acc, x0, x4, word, scale, 9, 12, DOT_DTYPE, PRECISION)
        acc = _pair_product(acc, x1, x5, word, scale, 5, 8, DOT_DTYPE, PRECISION)
        acc = _pair_product(acc, x2, x6, word, scale, 1, 4, DOT_DTYPE, PRECISION)
        acc = _pair_product(acc, x3, x7, word, scale, -3, 0, DOT_DTYPE, PRECISION)
    mask = m_mask[:, None] & n_mask[None, :]
    dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    split_k_store(
        acc, mask, dst, sums_ptr + offs_m[:, None] * N + offs_n[None, :], arrivals_ptr, tile, SPLIT_K
    )


@triton.jit
def _fp4_dequantize_kernel(
    packed_ptr,
    scales_ptr,
    mult_ptr,
    out_ptr,  # [ROWS, K] in the model dtype: weight rows row0 .. row0 + ROWS
    row0,
    ROWS,
    K,
    row_bytes,
    num_groups,
    GROUP_SIZE: tl.constexpr,
    E8M0: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """COLUMNS columns of BLOCK_N rows a program, stored in out's dtype."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < ROWS
    rows = row0 + tl.minimum(offs_n, ROWS - 1)
    k0 = tl.program_id(1) * COLUMNS
    row_scale = fp4_row_scales(mult_ptr, rows, E8M0)
    w = weight_tile(
        packed_ptr, scales_ptr, rows, row_scale, k0, row_bytes, num_groups, GROUP_SIZE, E8M0, BLOCK_N, COLUMNS
    )
    cols = k0 + tl.arange(0, COLUMNS)
    mask = n_mask[:, None] & (cols < K)[None, :]
    tl.store(out_ptr + offs_n[:, None] * K + cols[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_rows(
    packed: torch.Tensor,
    scale_codes: torch.Tensor,
    multiplier: torch.Tensor,
    group_size: int,
    e8m0: bool,
    row0: int,
    out: torch.Tensor,  # [rows, K], contiguous: receives weight rows row0 .. row0 + rows
) -> torch.Tensor:
    """Rows of an FP4 weight in out's dtype (the naive twin: naive.dequantize_weight)."""
    rows, k = out.shape
    assert out.is_contiguous() and row0 + rows <= packed.shape[0]
    grid = (triton.cdiv(rows, DEQUANT_BLOCK_N), triton.cdiv(k, STEP))
    _fp4_dequantize_kernel[grid](
        packed,
        scale_codes,
        multiplier,
        out,
        row0,
        rows,
        k,
        packed.shape[1],
        scale_codes.shape[1],
        GROUP_SIZE=group_size,
        E8M0=e8m0,
        BLOCK_N=DEQUANT_BLOCK_N,
        num_warps=4,
    )
    return out


def fp4_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,  # uint8 [N, K / 2]
    scale_codes: torch.Tensor,  # uint8 [N, G]
    multiplier: torch.Tensor,  # fp32 [N]
    group_size: int,
    e8m0: bool,
    out: torch.Tensor | None = None,  # [M, N] in x's dtype, unit column stride
    *,
    block_n: int | None = None,
    num_splits: int | None = None,
    num_warps: int = 4,
    dequant: bool | None = None,
    cuda_cores: bool | None = None,
) -> torch.Tensor:
    """See kernels/fp4_matmul/naive.py. Up to GEMV_MAX_M rows of x the split-K GEMVs, then the tensor-core
    tile kernel by 16-row blocks (K whole), from DEQUANT_MIN_M rows the dequantized slices (`dequant`
    forces them or not). block_n (weight rows a GEMV program), num_splits (its K slices, default
    gemv_splits), num_warps and cuda_cores (M = 1 on the CUDA cores, gemv.py: the default where K is a
    multiple of 8; else the tensor-core tile) are knobs for benchmarks/gpu_kernels.py's sweeps."""
    assert GROUPS.get(group_size) == ("e8m0" if e8m0 else "e4m3"), f"FP4 groups of {group_size}, e8m0={e8m0}"
    assert x.dim() == 2 and x.stride(1) == 1 and packed.is_contiguous() and scale_codes.is_contiguous()
    m, k = x.shape
    n = packed.shape[0]
    assert k <= 2 * packed.shape[1] and multiplier.shape == (n,) and multiplier.dtype == torch.float32
    out = x.new_empty((m, n)) if out is None else out
    assert out.shape == (m, n) and out.dtype == x.dtype and out.stride(1) == 1
    words = packed.shape[1] % 4 == 0  # (K a multiple of 8: the rows read as int32 words)
    if (m >= DEQUANT_MIN_M or not words) if dequant is None else dequant:

        def fill(row0: int, w: torch.Tensor) -> None:
            dequantize_rows(packed, scale_codes, multiplier, group_size, e8m0, row0, w)

        return sliced_matmul(x, n, out, fill)
    assert words, "the FP4 GEMVs read a row as int32 words: K a multiple of 8"
    cuda_cores = m == 1 if cuda_cores is None else cuda_cores
    assert not cuda_cores or m == 1, "the CUDA-core GEMV takes one row of x"
    block_m = 1 if cuda_cores else 16
    block_n = block_n or (GEMV_BLOCK_N if cuda_cores else TILE_GEMV_BLOCK_N)
    steps = triton.cdiv(k, STEP)
    # (GEMV_MAX_M+ rows: the M blocks fill the GPU, and the partial sums' buffer holds GEMV_MAX_M rows)
    splits = num_splits or (gemv_splits(n, steps, block_n, x.device) if m <= GEMV_MAX_M else 1)
    assert m <= GEMV_MAX_M or splits == 1, f"K slices take up to {GEMV_MAX_M} rows of x"
    per_split = triton.cdiv(steps, splits)
    split_k = per_split < steps
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), triton.cdiv(steps, per_split))
    sums, arrivals = split_buffers(x.device, n, grid[1]) if split_k else (out, out)
    common = dict(
        GROUP_SIZE=group_size,
        E8M0=e8m0,
        EVEN_K=k % STEP == 0 and 2 * packed.shape[1] == k,
        SPLIT_K=split_k,
        BLOCK_N=block_n,
        num_warps=num_warps,
    )
    weights = (packed.view(torch.int32), scale_codes, multiplier, out, sums, arrivals)
    if cuda_cores:  # M = 1 (gemv.py)
        fp4_gemv_cuda_cores_kernel[grid](
            x, *weights, n, k, packed.shape[1] // 4, scale_codes.shape[1], per_split, STEP=STEP, **common
        )
        return out
    _fp4_gemv_kernel[grid](
        x,
        *weights,
        m,
        n,
        k,
        packed.shape[1] // 4,
        scale_codes.shape[1],
        x.stride(0),
        out.stride(0),
        per_split,
        BLOCK_M=block_m,
        DOT_DTYPE=dot_dtype(x.dtype),
        PRECISION=dot_precision(x.dtype),
        **common,
    )
    return out
