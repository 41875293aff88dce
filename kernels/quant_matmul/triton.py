"""W4A16 / W6A16 / W8A16 matmul with the dequantization fused into the loads.

Weights stay packed in memory (engine/quant/groupwise.py's layout: groups of GROUP_SIZE input columns,
4-bit codes two per byte with the even column in the low nibble, w = q * scale + minimum; 6-bit codes four
per little-endian 24-bit word (3 bytes), first code in the low bits, w = q * scale + minimum; 8-bit signed
codes, w = q * scale). The products run on the model's half dtype (fp32 under the interpreter) with fp32
accumulation, and no weight is scaled or shifted element by element: per group,

    sum_k x_k (q_k scale + minimum) = scale * sum_k x_k (BASE + q_k) + (minimum - BASE scale) * sum_k x_k

where BASE + q is what a code becomes when OR-ed into the mantissa of a power of two (bf16 / fp16: exact,
no int-to-float instruction; fp32 operands take the codes as they are, BASE 0). The tensor cores compute
the first sum, and in the GEMV the second too (a product with ones: there they idle while instruction
issue is the limit); the GEMM adds. The scale and minimum apply once per output and group, in fp32, as two
FMAs into the running sum. Each width is split into products whose k index needs no interleaving of
unpacked codes:

* 4-bit, groups of 64+: the row is read as int32 words of eight codes. Product p takes codes p and p + 4
  of every word with one shift, mask and OR: they land in the two 16-bit halves of one register, as the
  tensor-core operand holds a pair (16 + q, mantissa bits below the exponent of 16.0). The activations
  are loaded once per group and split into the four products' columns in registers.
* 4-bit, groups of 32: the same words, two products: codes e and e + 2 of each word (with e + 4, e + 6 in
  their pairs) are the columns of parity e, sixteen to a group;
* 6-bit: the row read as int32 (three words hold four 24-bit words), four products over the columns
  4i + p (BASE 128 / 1024); 8-bit: one product, scaled after.

Shapes:
* long prefill chunks (M >= DEQUANT_MIN_M): the weight dequantized by slices, cuBLAS products (dequant.py);
* prefill (GEMV_MAX_M < M < DEQUANT_MIN_M): a tiled GEMM, one program per [BLOCK_M, BLOCK_N] output tile,
  K in group-sized steps (one scale per row of the weight tile per step);
* decode (M <= GEMV_MAX_M = 16): split-K GEMV, each program takes a slice of K for BLOCK_N outputs and adds
  its partial sums into an fp32 buffer; the slices are sized so every SM gets several programs
  (gemv_splits). The last slice of a tile to finish (an arrival counter per tile) stores the tile in x's
  dtype and zeroes its part of the buffer and the counter, so the next GEMV finds them clean: one kernel a
  GEMV. At M = 1 the 4- and 6-bit weights take the CUDA cores instead (gemv4.py, gemv6.py).

scripts/cuda_compile_check.py --sass counts the instructions of the compiled inner loop per KB of packed
weight, which bounds the fraction of HBM bandwidth an SM can keep up with (docs/kernels.md).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ninfer_kernels.quant_matmul import DEQUANT_MIN_M, GEMV_MAX_M, MIN_GROUP
from ninfer_kernels.quant_matmul.dequant import dequant_matmul
from ninfer_kernels.quant_matmul.gemv4 import MAGIC_12, MAGIC_16, gemv4_cuda_cores_kernel
from ninfer_kernels.quant_matmul.gemv4h import HALF_MAGIC, gemv4_half2_kernel
from ninfer_kernels.quant_matmul.gemv6 import MAGIC_11, MAGIC_17, gemv6_cuda_cores_kernel
from ninfer_kernels.quant_matmul.gemv8 import MAGIC_7, MAGIC_15, gemv8_cuda_cores_kernel
from ninfer_kernels.quant_matmul.split_k import split_k_store
from ninfer_kernels.triton_codes import (
    nibble_pair_base,
    nibble_pairs,
    offset_code_base,
    offset_codes,
    six_bit_words,
)
from ninfer_kernels.triton_config import (
    compute_capability,
    dot_dtype,
    dot_precision,
    interpreting,
    sm_count,
)


@triton.jit
def _nibble_product(
    x,  # [BLOCK_M, 2 * EIGHTH]: the columns 8t + p (k index 2t) and 8t + 4 + p (2t + 1)
    word,  # [BLOCK_N, EIGHTH] int32
    p: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EIGHTH: tl.constexpr,
    PRECISION: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """x @ (nibble_pair_base + Q)^T over codes p and p + 4 of every word."""
    v = tl.reshape(nibble_pairs(word, p, DTYPE), (BLOCK_N, 2 * EIGHTH))
    return tl.dot(x, tl.trans(v), input_precision=PRECISION)


@triton.jit
def _row_sums(x, x0, x1, x2, x3, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, SUMS_BY_DOT: tl.constexpr):
    """Each row's sum over the group ([BLOCK_M, BLOCK_N] or [BLOCK_M, 1]), x0..x3 being x's four column
    sets in the operand dtype. SUMS_BY_DOT (the GEMV's default): from the tensor cores (products with
    ones), which idle there if the instruction issue is the limit; else (the GEMM, which keeps the tensor
    cores busy) added in fp32."""
    if SUMS_BY_DOT:
        ones = tl.full((x0.shape[1], BLOCK_N), 1.0, x0.dtype)
        s = tl.dot(x0, ones, input_precision=PRECISION) + tl.dot(x1, ones, input_precision=PRECISION)
        return s + tl.dot(x2, ones, input_precision=PRECISION) + tl.dot(x3, ones, input_precision=PRECISION)
    else:
        return tl.sum(x.to(tl.float32), axis=1)[:, None]


@triton.jit
def _columns_mod4(x, BLOCK_M: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """x [BLOCK_M, GROUP_SIZE] split into its columns 4j, 4j + 1, 4j + 2, 4j + 3, each [BLOCK_M, GROUP_SIZE / 4]
    with k index j (in registers: a reshape and two splits)."""
    x_p0, x_p1 = tl.split(tl.reshape(x, (BLOCK_M, GROUP_SIZE // 4, 2, 2)))  # [m, j, p1, p0]
    x0, x2 = tl.split(x_p0)
    x1, x3 = tl.split(x_p1)
    return x0, x1, x2, x3


@triton.jit
def _scaled(total, prod, xsum, scale, minimum, base):
    """total + sum_k x (q s + min), where sum_k x (q s + min) = s * sum_k x (base + q) + (min - base s) *
    sum_k x, in fp32: prod the first sum's product, xsum the activations' row sums; two FMAs an output."""
    return tl.fma(xsum, (minimum - base * scale)[None, :], tl.fma(prod, scale[None, :], total))


@triton.jit
def _tile_product(
    total,  # [BLOCK_M, BLOCK_N] fp32, the products of the groups before
    x_ptr,
    packed_ptr,
    scales_ptr,
    mins_ptr,
    columns_ptr,
    offs_m,
    offs_n,
    k0,
    M,
    N,
    K,
    KP,
    stride_xm,
    num_groups,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    SUMS_BY_DOT: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
):
    """x[offs_m, k0:k0+GROUP_SIZE] @ W[offs_n, k0:k0+GROUP_SIZE]^T as [BLOCK_M, BLOCK_N] fp32 (HAS_COLUMNS:
    x's columns columns[k0:k0+GROUP_SIZE], an act-order weight's stored order)."""
    m_mask = offs_m < M
    n_mask = offs_n < N
    group = k0 // GROUP_SIZE
    scale = tl.load(scales_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    if HAS_MINS:
        minimum = tl.load(mins_ptr + offs_n * num_groups + group, mask=n_mask, other=0.0).to(tl.float32)
    else:
        minimum = tl.zeros_like(scale)
    kk = k0 + tl.arange(0, GROUP_SIZE)
    inside = kk < K
    xk = tl.load(columns_ptr + kk, mask=inside, other=0) if HAS_COLUMNS else kk
    x = tl.load(
        x_ptr + offs_m[:, None] * stride_xm + xk[None, :], mask=m_mask[:, None] & inside[None, :], other=0.0
    )
    if BITS == 4 and GROUP_SIZE >= 64:  # the packed row read as int32 words of eight codes (columns 8t..8t+7)
        EIGHTH: tl.constexpr = GROUP_SIZE // 8
        t = tl.arange(0, EIGHTH)
        word = tl.load(
            packed_ptr + offs_n[:, None] * (KP // 8) + (k0 // 8 + t)[None, :], mask=n_mask[:, None], other=0
        )
        # product p takes the columns 4j + p, j = 2t + h: code p (h = 0) and p + 4 (h = 1) of word t
        x0, x1, x2, x3 = _columns_mod4(x.to(DOT_DTYPE), BLOCK_M, GROUP_SIZE)
        prod = _nibble_product(x0, word, 0, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        prod += _nibble_product(x1, word, 1, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        prod += _nibble_product(x2, word, 2, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        prod += _nibble_product(x3, word, 3, BLOCK_N, EIGHTH, PRECISION, DOT_DTYPE)
        xsum = _row_sums(x, x0, x1, x2, x3, BLOCK_N, PRECISION, SUMS_BY_DOT)
        total = _scaled(total, prod, xsum, scale, minimum, nibble_pair_base(DOT_DTYPE))
    elif BITS == 4:  # groups of 32: the row as int32 words too; two products, over each column parity
        t = tl.arange(0, GROUP_SIZE // 8)
        word = tl.load(
            packed_ptr + offs_n[:, None] * (KP // 8) + (k0 // 8 + t)[None, :], mask=n_mask[:, None], other=0
        )
        # column 8t + 4h + 2j + e is code 2j + e (h = 0) or 2j + e + 4 (h = 1) of word t: product e takes
        # the pairs of codes e and e + 2, k index (2t + h) * 2 + j
        x_e0, x_e1 = tl.split(tl.reshape(x.to(DOT_DTYPE), (BLOCK_M, GROUP_SIZE // 8, 2, 2, 2)))
        x_e0 = tl.reshape(x_e0, (BLOCK_M, GROUP_SIZE // 2))
        x_e1 = tl.reshape(x_e1, (BLOCK_M, GROUP_SIZE // 2))
        w_e0 = tl.join(nibble_pairs(word, 0, DOT_DTYPE), nibble_pairs(word, 2, DOT_DTYPE))
        w_e1 = tl.join(nibble_pairs(word, 1, DOT_DTYPE), nibble_pairs(word, 3, DOT_DTYPE))
        w_e0 = tl.reshape(w_e0, (BLOCK_N, GROUP_SIZE // 2))
        w_e1 = tl.reshape(w_e1, (BLOCK_N, GROUP_SIZE // 2))
        prod = tl.dot(x_e0, tl.trans(w_e0), input_precision=PRECISION)
        prod += tl.dot(x_e1, tl.trans(w_e1), input_precision=PRECISION)
        if SUMS_BY_DOT:  # the row sums from the tensor cores, as _row_sums does
            ones = tl.full((GROUP_SIZE // 2, BLOCK_N), 1.0, DOT_DTYPE)
            xsum = tl.dot(x_e0, ones, input_precision=PRECISION) + tl.dot(
                x_e1, ones, input_precision=PRECISION
            )
        else:
            xsum = tl.sum(x.to(tl.float32), axis=1)[:, None]
        total = _scaled(total, prod, xsum, scale, minimum, nibble_pair_base(DOT_DTYPE))
    elif BITS == 6:  # four products over the columns 4i + p, the codes of each 24-bit word
        word = six_bit_words(packed_ptr, offs_n, n_mask, k0, KP, BLOCK_N, GROUP_SIZE)  # [BLOCK_N, GROUP / 4]
        x0, x1, x2, x3 = _columns_mod4(x.to(DOT_DTYPE), BLOCK_M, GROUP_SIZE)
        prod = tl.dot(x0, tl.trans(offset_codes(word & 63, DOT_DTYPE)), input_precision=PRECISION)
        prod += tl.dot(x1, tl.trans(offset_codes((word >> 6) & 63, DOT_DTYPE)), input_precision=PRECISION)
        prod += tl.dot(x2, tl.trans(offset_codes((word >> 12) & 63, DOT_DTYPE)), input_precision=PRECISION)
        prod += tl.dot(x3, tl.trans(offset_codes((word >> 18) & 63, DOT_DTYPE)), input_precision=PRECISION)
        xsum = _row_sums(x, x0, x1, x2, x3, BLOCK_N, PRECISION, SUMS_BY_DOT)
        total = _scaled(total, prod, xsum, scale, minimum, offset_code_base(DOT_DTYPE))
    else:  # 8-bit, symmetric: the scale applies to the product
        q = tl.load(packed_ptr + offs_n[:, None] * KP + kk[None, :], mask=n_mask[:, None], other=0)
        prod = tl.dot(x.to(DOT_DTYPE), tl.trans(q.to(DOT_DTYPE)), input_precision=PRECISION)
        total = tl.fma(prod, scale[None, :], total)
    return total


@triton.jit
def _quant_matmul_kernel(
    x_ptr,
    packed_ptr,
    scales_ptr,
    mins_ptr,
    out_ptr,  # [M, N] in x's dtype
    sums_ptr,  # SPLIT_K: fp32 partial sums [M, N], zero before and after the kernel
    arrivals_ptr,  # SPLIT_K: int32 per output tile, the K slices done so far; zero before and after
    columns_ptr,  # HAS_COLUMNS: int32 [K], the input column each stored column holds (act-order)
    M,
    N,
    K,
    KP,
    stride_xm,
    stride_om,
    num_groups,
    GROUPS_PER_SPLIT,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    HAS_MINS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    SUMS_BY_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    HAS_COLUMNS: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * GROUPS_PER_SPLIT * GROUP_SIZE
    k_end = tl.minimum(K, k_start + GROUPS_PER_SPLIT * GROUP_SIZE)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, GROUP_SIZE):
        acc = _tile_product(
            acc,
            x_ptr,
            packed_ptr,
            scales_ptr,
            mins_ptr,
            columns_ptr,
            offs_m,
            offs_n,
            k0,
            M,
            N,
            K,
            KP,
            stride_xm,
            num_groups,
            BITS,
            GROUP_SIZE,
            HAS_MINS,
            BLOCK_M,
            BLOCK_N,
            PRECISION,
            DOT_DTYPE,
            SUMS_BY_DOT,
            HAS_COLUMNS,
        )
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    dst = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    split_k_store(
        acc, mask, dst, sums_ptr + offs_m[:, None] * N + offs_n[None, :], arrivals_ptr, tile, SPLIT_K
    )


# 128 weight rows a GEMV program: the activations' share of the inner loop (their load, the split into the
# four 4-bit products) spreads over twice the rows of a 64-row tile; about 200 instead of 280 instructions
# per KB of packed 4-bit weight on SM 9.0 (scripts/cuda_compile_check.py --sass)
GEMV_BLOCK_N = 128
# 4-bit on SM 9.0+: 256 rows (155 instructions per KB, 238 registers, no spill; SM 8.6 would spill 20
# bytes). Measured: an H200 (2026-12-04, CUDA graph replay over 4 weight copies) ran the 17408 x 5120 GEMV
# at M = 1 in 40.2-40.7 us with 256-row tiles (16 K slices), 4 warps; 128-row tiles, 8 warps, 4 stages and
# fp32 group sums all slower (docs/benchmarks.md). M = 1 itself takes the CUDA-core kernel below
WIDE_GEMV_BLOCK_N = 256
GEMV_PROGRAMS_PER_SM = 8
# the 4-bit GEMV at M = 1 on the CUDA cores (gemv4.py) instead of the tensor-core tile: an H200 (2026-12-04,
# graph replay) ran the 17408 x 5120 GEMV in groups of 128 in 25.7 us so, 128 rows and 4 warps a program
# (25.3-36.9 over 128 / 256 / 512 rows, 2 / 4 / 8 warps, 1x / 2x the K slices), against 40.2 for the
# tensor-core kernel's best. That was its first version (270 instructions per KB, 128 registers); the
# present one (198, 95) is not yet timed. Groups of 32 (a GGUF's Q4 blocks, q4.6's 4-bit upgrade) take it
# too, with 256-row tiles (the activations' work a step shared by twice the rows: 228 instructions per
# KB, 94 registers, no trip through shared memory, against the tensor-core kernel's 261 and that trip,
# which the first version's timing showed to be the tensor-core GEMV's limit; not yet timed: gemv_sweep
# times both)
# 6-bit at M = 1 takes the CUDA cores as well (gemv6.py: 137 instructions per KB at 128 rows against the
# tensor-core kernel's 210, which the H200 measured at 12% of HBM, 119.5 us; the new one not yet timed)
GEMV_CUDA_CORES = True
CUDA_CORE_GEMV_BLOCK_N = 128


# 8-bit takes them only when asked (cuda_cores=True; gemv8.py: 124 instructions per KB at 64 rows against
# the tensor-core kernel's 123, which the H200 measured at 59% of HBM, 31.9 us; groups of 32: 126 at 256
# rows against 179: gemv_sweep times both)
CUDA_CORE_GEMV_WIDTHS = (4, 6)
# per width: the kernel, a row's int32 words for KP columns, its exponent-bit arguments
CUDA_CORE_GEMVS = {
    4: (gemv4_cuda_cores_kernel, lambda kp: kp // 8, (MAGIC_12, MAGIC_16)),
    6: (gemv6_cuda_cores_kernel, lambda kp: kp * 3 // 16, (MAGIC_11, MAGIC_17)),
    8: (gemv8_cuda_cores_kernel, lambda kp: kp // 4, (MAGIC_7, MAGIC_15)),
}


def cuda_core_gemv_block_n(bits: int, group_size: int) -> int:
    """Weight rows a CUDA-core GEMV program takes by default: CUDA_CORE_GEMV_BLOCK_N, twice that for groups
    of 32 or fewer (whose short group rows would leave a step little weight for its activation loads), half
    for 8-bit groups of 64+ (twice the words a row: 128 registers at 64 rows, 167 at 128)."""
    if group_size < 64:
        return 2 * CUDA_CORE_GEMV_BLOCK_N
    return CUDA_CORE_GEMV_BLOCK_N // (2 if bits == 8 else 1)


# its K loop's pipeline depth (num_stages there): 1 as measured; 2-4 copy the next groups' words
# asynchronously while one is computed (the compile check: 1-2 groups in flight at 128 rows, 8.7-25 KB of
# shared memory, ~3% more instructions), which at 38% of HBM with one group in flight a program may be
# what is missing: the next lease's gemv_sweep times them (stages=1..4)
CUDA_CORE_GEMV_STAGES = 1
# the 4-bit GEMV at M = 1 in packed half precision (gemv4h.py: 136 instructions per KB at 128 rows against
# gemv4.py's 198, SM 9.0; 2.5-5.2e-3 RMS-relative error against 2e-4 with fp16 outputs) for 16-bit
# activations: off until gemv_sweep times it on a GPU (its f16x2 PTX has not run on one yet);
# NINFER_GEMV_HALF2=1 (read at import) turns it on, so a whole decode can be timed both ways
GEMV_HALF2 = os.environ.get("NINFER_GEMV_HALF2", "0") == "1"
# activation rows gemv4h.py takes in one program (C2-C4 decode, speculative verification's k + 1 rows): each
# word pair's codes converted once for all of them
HALF2_MAX_M = 4


def gemv_block_n(bits: int, device: torch.device) -> int:
    """Weight rows a GEMV program takes by default (GEMV_BLOCK_N, WIDE_GEMV_BLOCK_N)."""
    return WIDE_GEMV_BLOCK_N if bits == 4 and compute_capability(device) >= 90 else GEMV_BLOCK_N


def gemv_splits(n: int, groups: int, block_n: int, device: torch.device) -> int:
    """K slices of the split-K GEMV: about GEMV_PROGRAMS_PER_SM programs per SM, so every SM streams weights
    to the end. With one program per output tile, a 17408-row matrix in 64-row tiles is 272 programs: two
    on most of an H200's 132 SMs, three on a few, which then finish alone at a fraction of the bandwidth."""
    tiles = triton.cdiv(n, block_n)
    return max(1, min(groups, triton.cdiv(GEMV_PROGRAMS_PER_SM * sm_count(device), tiles)))


_SPLIT_BUFFERS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def split_buffers(device: torch.device, n: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The zeroed fp32 partial sums [GEMV_MAX_M * n] and int32 arrival counters [tiles] that split-K GEMVs
    with n outputs in `tiles` tiles share on a device. Each call leaves them zero (its last K slice per
    tile clears what it read), so a GEMV is one kernel: no memset before it, no cast after. Kept for the
    process: a captured CUDA graph holds their addresses. One stream at a time (the engine's)."""
    key = (device, n, tiles)
    if key not in _SPLIT_BUFFERS:
        _SPLIT_BUFFERS[key] = (
            torch.zeros(GEMV_MAX_M * n, dtype=torch.float32, device=device),
            torch.zeros(tiles, dtype=torch.int32, device=device),
        )
    return _SPLIT_BUFFERS[key]


def quant_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scales: torch.Tensor,  # fp16 [N, G]
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    out: torch.Tensor | None = None,  # [M, N] in x's dtype, unit column stride (see naive.py)
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    sums_by_dot: bool | None = None,
    cuda_cores: bool | None = None,
    prefetch: bool = False,
    half2: bool | None = None,
    dequant: bool | None = None,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """See kernels/quant_matmul/naive.py. From DEQUANT_MIN_M rows of x on, the weight is dequantized by
    slices and multiplied by cuBLAS (dequant.py); `dequant` forces that path or the fused kernels. block_m
    (GEMM rows a program, default 32), block_n (outputs a program: GEMV gemv_block_n, GEMM 64),
    num_splits (GEMV: K slices, default gemv_splits), num_warps, num_stages (the K loop's pipeline depth:
    Triton's default 3; the CUDA-core GEMV's CUDA_CORE_GEMV_STAGES), sums_by_dot (the activations' group
    sums from the tensor cores; default: in the GEMV) and cuda_cores (the 4- and 6-bit GEMVs at M = 1 on
    the CUDA cores, gemv4.py / gemv6.py; default GEMV_CUDA_CORES) and prefetch (gemv4.py: the next group's
    words loaded into registers a step ahead) and half2 (gemv4h.py: two codes an f16x2 instruction, 16-bit x;
    default GEMV_HALF2) are tuning knobs for benchmarks/gpu_kernels.py's sweeps. columns (int32 [K], an
    act-order weight's stored order): the fused kernels load x's columns through it; the dequantized
    slices' path gathers x first."""
    assert not prefetch or bits == 4, "prefetch is a knob of the 4-bit CUDA-core GEMV (gemv4.py)"
    if half2 is None:
        half2 = GEMV_HALF2 and bits == 4 and x.dtype != torch.float32
    assert not half2 or (bits == 4 and x.dtype != torch.float32), "half2: 4-bit weights, 16-bit x (gemv4h.py)"
    assert bits in (4, 6, 8) and x.dim() == 2 and x.stride(1) == 1 and packed.is_contiguous()
    assert group_size >= MIN_GROUP[bits], (
        f"{bits}-bit groups of {group_size}: the kernel needs {MIN_GROUP[bits]}+"
    )
    m, k = x.shape
    n, num_groups = scales.shape
    kp = num_groups * group_size
    assert k <= kp, f"x has {k} columns, the weight {kp}"
    out = x.new_empty((m, n)) if out is None else out
    assert out.shape == (m, n) and out.dtype == x.dtype and out.stride(1) == 1
    long_chunk = m >= DEQUANT_MIN_M if dequant is None else dequant
    assert columns is None or (columns.dtype == torch.int32 and columns.shape == (k,))
    if long_chunk:
        x = x if columns is None else x.index_select(1, columns)
        return dequant_matmul(x, packed, scales, minimums, bits, group_size, out)
    common = dict(
        BITS=bits,
        GROUP_SIZE=group_size,
        HAS_MINS=minimums is not None,
        PRECISION=dot_precision(x.dtype),
        DOT_DTYPE=dot_dtype(x.dtype),
    )
    mins = minimums if minimums is not None else scales
    groups = triton.cdiv(k, group_size)
    gemv = m <= GEMV_MAX_M
    cuda_cores = GEMV_CUDA_CORES and bits in CUDA_CORE_GEMV_WIDTHS if cuda_cores is None else cuda_cores
    # (6-bit weights carry minimums, 8-bit ones none: engine/quant/groupwise.py)
    takes = bits == 4 or (minimums is not None) == (bits == 6)
    half2 = half2 and m <= HALF2_MAX_M
    cuda_cores = cuda_cores and gemv and (m == 1 or half2) and takes
    if cuda_cores:  # the GEMVs at M = 1 (gemv4.py, gemv6.py, gemv8.py) and gemv4h.py's rows in one program
        block_m = triton.next_power_of_2(m) if half2 else 1
        block_n = block_n or cuda_core_gemv_block_n(bits, group_size)
    elif gemv:  # split-K GEMV
        block_m, block_n = 16, block_n or gemv_block_n(bits, x.device)
    else:  # tiled GEMM, K whole in every program
        block_m, block_n = block_m or 32, block_n or 64
    per_split = (
        triton.cdiv(groups, num_splits or gemv_splits(n, groups, block_n, x.device)) if gemv else groups
    )
    # K in slices (split_buffers: the partial sums' buffer and the tiles' arrival counters), or whole (a
    # GEMM, or a large head such as the vocabulary's)
    split_k = per_split < groups
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), triton.cdiv(groups, per_split))
    sums, arrivals = split_buffers(x.device, n, grid[1]) if split_k else (out, out)
    weights = (packed.view(torch.int32) if bits in (4, 6) else packed, scales, mins)
    # (a tensor for the pointer where there is no column order: never read)
    order = dict(HAS_COLUMNS=columns is not None)
    columns = columns if columns is not None else scales
    if cuda_cores:
        launch = dict(
            GROUP_SIZE=group_size,
            SPLIT_K=split_k,
            BLOCK_N=block_n,
            EVEN_K=k % group_size == 0,
            STAGES=num_stages or CUDA_CORE_GEMV_STAGES,
            num_warps=num_warps,
            **order,
        )
        if half2:  # two codes an f16x2 instruction (gemv4h.py; inline PTX, emulated by the interpreter)
            gemv4_half2_kernel[grid](
                x,
                *weights,
                out,
                sums,
                arrivals,
                columns,
                m,
                n,
                k,
                x.stride(0),
                out.stride(0),
                kp // 8,
                num_groups,
                per_split,
                HALF_MAGIC,
                HAS_MINS=minimums is not None,
                ROWS_X=block_m,
                SLICE=triton.next_power_of_2(min(per_split * group_size, k)),
                EMULATE=interpreting(),
                **launch,
            )
            return out
        kernel, row_words, magics = CUDA_CORE_GEMVS[bits]
        widths = dict(HAS_MINS=minimums is not None, PREFETCH=prefetch) if bits == 4 else {}
        if bits == 8:  # (no minimums)
            weights = (packed.view(torch.int32), scales)
        kernel[grid](
            x,
            *weights,
            out,
            sums,
            arrivals,
            columns,
            n,
            k,
            row_words(kp),
            num_groups,
            per_split,
            *magics,
            **launch,
            **widths,
        )
        return out
    _quant_matmul_kernel[grid](
        x,
        *weights,
        out,
        sums,
        arrivals,
        columns,
        m,
        n,
        k,
        kp,
        x.stride(0),
        out.stride(0),
        num_groups,
        per_split,
        SPLIT_K=split_k,
        SUMS_BY_DOT=gemv if sums_by_dot is None else sums_by_dot,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        num_stages=num_stages or 3,
        **common,
        **order,
    )
    return out
