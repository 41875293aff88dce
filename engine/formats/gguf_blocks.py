"""GGUF block-quantized matrices as ninfer's group-wise QuantizedTensor (engine/quant/groupwise.py), so that
a GPU multiplies a GGUF's weights packed with the fused kernels instead of holding them dequantized.

Taken as stored (the codes unchanged, repacked two per byte in column order):
  Q4_0  w = d (q - 8)                  -> 4-bit, groups of 32: scale d, minimum -8 d (exact)
  Q4_1  w = d q + m                    -> 4-bit, groups of 32: scale d, minimum m (exact)
  Q4_K  w = d sc_j q - dmin m_j        -> 4-bit, groups of 32 (the sub-blocks): scale d sc_j, minimum
                                          -dmin m_j, each rounded once to fp16: a weight moves by at most
                                          2^-11 (|d sc_j q| + |dmin m_j|), about 1% of the grid's step
                                          in a typical group, where the 4-bit rounding itself is up to 50%
  Q8_0  w = d q                        -> 8-bit, groups of 32: scale d (exact)
Re-quantized from the dequantized values (round to nearest over each group's full range: groupwise's
clipping search lowered no error on such values and took 6-7 times as long, benchmarks/gguf_blocks.py) at
the next width the fused kernels take, in the smallest groups they take:
  2-, 3- and other 4-bit types (Q2_K, Q3_K, IQ*, MXFP4, ...) -> 4-bit, groups of 32
  5-bit (Q5_0, Q5_1, Q5_K)                                   -> 6-bit, groups of 64
  6-bit (Q6_K)                                               -> 8-bit, groups of 32
On Gaussian weights a Q5_0 / Q5_1 tensor's error (4.3% / 3.8% relative RMS against the float weights)
becomes 4.8% / 4.4% at 6 bits in groups of 64, still under Q4_0 / Q4_1's 8.6% / 7.8%; Q6_K at 8 bits
moves by 0.4%. A file's full precision comes from `ninfer convert` of the HF checkpoint instead.
Float tensors (F32, F16, BF16) are not block-quantized: the loader reads them dense, except float matrices
in a file whose other matrices are block-quantized (llama.cpp leaves some small ones float, such as
Qwen3.5's ssm_alpha / ssm_beta), which are held at 8 bits in groups of 32 (each group's full range: within
half a step, 1/254 of its largest weight): a fused projection runs packed only when every part of it is.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from engine.quant.groupwise import QuantizedTensor, pack, quantize, stored_nbytes
from engine.quant.layer import fused_kernel_takes

DENSE = {T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64}
EXACT = {T.Q4_0: 4, T.Q4_1: 4, T.Q4_K: 4, T.Q8_0: 8}
GROUP = {4: 32, 6: 64, 8: 32}
REQUANT_ROWS = 4096  # rows re-quantized at once (their fp32 copies and the clipping search's)


def is_block_quantized(qtype: T) -> bool:
    return qtype not in DENSE


def packable_float(qtype: T) -> bool:
    """A float type whose matrices the GPU can hold at 8 bits in groups of 32."""
    return qtype in (T.F32, T.F16, T.BF16)


def source_bits(qtype: T) -> int:
    """The bits a block type spends per code: Q4_1 -> 4, Q6_K -> 6, IQ2_XXS -> 2; MXFP4 / NVFP4 -> 4."""
    m = re.search(r"Q(\d)", qtype.name)
    return int(m.group(1)) if m else 4


def target(qtype: T) -> tuple[int, int]:
    """(bits, group size) a matrix of `qtype` is held at on the GPU (a float matrix beside block-quantized
    ones: 8 bits, see the module docstring)."""
    if qtype in EXACT:
        bits = EXACT[qtype]
    elif qtype in DENSE:
        bits = 8
    else:
        bits = {5: 6, 6: 8, 8: 8}.get(source_bits(qtype), 4)
    return bits, GROUP[bits]


def kernel_takes(qtype: T, shape: tuple[int, int]) -> bool:
    """Whether the fused kernels take the matrix as to_groupwise holds it (a re-quantized 6-bit matrix whose
    K is not a multiple of 64 would fall back to groups of 32, which they do not)."""
    bits, group = target(qtype)
    return shape[1] % group == 0 and fused_kernel_takes(bits, group)


def held_nbytes(qtype: T, shape: tuple[int, int]) -> int:
    """Bytes the GPU holds for a matrix of `qtype` and `shape` [N, K] it keeps packed."""
    bits, group = target(qtype)
    return stored_nbytes(shape, bits, group)


def to_groupwise(data: np.ndarray, qtype: T, shape: tuple[int, int]) -> QuantizedTensor:
    """The QuantizedTensor of a GGUF matrix [N, K] stored as `qtype` blocks (`data`: the tensor's bytes)."""
    n, k = shape
    _, block_bytes = quants.GGML_QUANT_SIZES[qtype]
    if qtype not in EXACT:  # a slice of rows at a time: a vocabulary head is billions of weights
        bits, group = target(qtype)
        rows = np.asarray(data).reshape(n, -1)
        parts = [
            quantize(_dequantized(rows[i : i + REQUANT_ROWS], qtype), bits, group, clip_search=False)
            for i in range(0, n, REQUANT_ROWS)
        ]
        return QuantizedTensor(
            bits=bits,
            group_size=parts[0].group_size,
            shape=(n, k),
            packed=torch.cat([q.packed for q in parts]),
            scales=torch.cat([q.scales for q in parts]),
            minimums=torch.cat([q.minimums for q in parts]) if parts[0].minimums is not None else None,
        )
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, block_bytes)  # [n * k / block, bytes]
    d = _fp16(blocks[:, 0:2])  # [B, 1]
    if qtype == T.Q8_0:
        codes = blocks[:, 2:].view(np.int8)
        return _tensor(8, shape, codes, d, None)
    if qtype == T.Q4_K:  # 8 sub-blocks of 32: (scale, minimum) = (d sc_j, -dmin m_j)
        dmin = _fp16(blocks[:, 2:4])
        sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16])  # [B, 8] each
        codes = _nibbles(blocks[:, 16:], 32)  # [B, 256]
        scales, minimums = d * sc.astype(np.float32), -dmin * m.astype(np.float32)
        return _tensor(4, shape, codes, scales, minimums)
    if qtype == T.Q4_0:
        return _tensor(4, shape, _nibbles(blocks[:, 2:], 16), d, -8 * d)
    return _tensor(4, shape, _nibbles(blocks[:, 4:], 16), d, _fp16(blocks[:, 2:4]))  # Q4_1


def _dequantized(rows: np.ndarray, qtype: T) -> torch.Tensor:
    """fp32 rows of a matrix stored as `qtype` (a copy: the file is mapped read-only)."""
    return torch.from_numpy(np.array(quants.dequantize(rows, qtype), dtype=np.float32))


def _fp16(two_bytes: np.ndarray) -> np.ndarray:
    """[B, 2] little-endian fp16 bytes -> [B, 1] fp32."""
    return np.ascontiguousarray(two_bytes).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """GGML 4-bit codes in column order: each `run` bytes hold `run` columns in their low nibbles, then the
    next `run` columns in their high nibbles. qs [B, bytes] -> [B, 2 * bytes] uint8."""
    b = qs.shape[0]
    runs = qs.reshape(b, -1, 1, run)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(b, -1)


def _tensor(
    bits: int, shape: tuple[int, int], codes: np.ndarray, scales: np.ndarray, minimums: np.ndarray | None
) -> QuantizedTensor:
    """codes [B, block] and per-group scales / minimums [B, block / 32] (blocks in row order) as one tensor."""
    n, k = shape
    codes_t = torch.from_numpy(np.ascontiguousarray(codes)).reshape(n, k)
    groups = k // GROUP[bits]
    return QuantizedTensor(
        bits=bits,
        group_size=GROUP[bits],
        shape=(n, k),
        packed=pack(codes_t, bits) if bits == 4 else codes_t.clone(),
        scales=torch.from_numpy(scales.astype(np.float16)).reshape(n, groups),
        minimums=torch.from_numpy(minimums.astype(np.float16)).reshape(n, groups)
        if minimums is not None
        else None,
    )


def moves_whole_groups(index: torch.Tensor, group: int) -> bool:
    """Whether a column order `index` moves whole groups of `group` columns (what select can do packed)."""
    if index.numel() % group:
        return False
    runs = index.view(-1, group)
    return bool((runs == runs[:, :1] + torch.arange(group)).all() and (runs[:, 0] % group == 0).all())


def select(qt: QuantizedTensor, dim: int, index: torch.Tensor) -> QuantizedTensor:
    """The tensor whose weight is `qt`'s `index_select(dim, index)`, its codes left packed: rows in any
    order (or some of them: a fused projection's part), columns in whole groups (moves_whole_groups)."""
    if dim == 0:

        def rows(t):
            return None if t is None else t.index_select(0, index)

        shape = (len(index), qt.shape[1])
        return replace(
            qt, shape=shape, packed=rows(qt.packed), scales=rows(qt.scales), minimums=rows(qt.minimums)
        )
    if qt.padded_k != qt.shape[1] or not moves_whole_groups(index, qt.group_size):
        raise ValueError(f"a column order of {qt.group_size}-column groups cannot move this tensor's columns")
    n, groups = qt.scales.shape
    order = index.view(-1, qt.group_size)[:, 0] // qt.group_size

    def columns(t):
        return None if t is None else t.view(n, groups, -1)[:, order].reshape(n, -1)

    return replace(qt, packed=columns(qt.packed), scales=columns(qt.scales), minimums=columns(qt.minimums))
