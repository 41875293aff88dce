"""GGUF block types as group-wise tensors: the exact ones give gguf's own dequantized values back (Q4_K within
one fp16 rounding of each sub-block's scale and minimum), the others are re-quantized one width up."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.formats import gguf_blocks
from engine.formats.gguf_blocks import held_nbytes, kernel_takes, target, to_groupwise
from engine.models.loader import default_model_path, open_source
from engine.quant.groupwise import dequantize

N, K = 6, 512


def _fp16_bytes(rng, blocks: int, lo: float, hi: float) -> np.ndarray:
    return rng.uniform(lo, hi, (blocks, 1)).astype(np.float16).view(np.uint8)


def random_blocks(qtype: T, n: int = N, k: int = K, seed: int = 0) -> np.ndarray:
    """Raw bytes [n, k / block * block_bytes] of random `qtype` blocks with sensible fp16 scales."""
    rng = np.random.default_rng(seed)
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    count = n * k // block
    raw = rng.integers(0, 256, (count, block_bytes), dtype=np.uint8)
    d = _fp16_bytes(rng, count, 1e-3, 1e-2)
    if qtype in (T.Q4_0, T.Q8_0, T.Q4_1, T.Q4_K):
        raw[:, 0:2] = d
    if qtype == T.Q4_1:
        raw[:, 2:4] = _fp16_bytes(rng, count, -0.1, 0.0)
    if qtype == T.Q4_K:
        raw[:, 2:4] = _fp16_bytes(rng, count, 1e-3, 1e-2)
    if qtype == T.Q6_K:  # ql, qh, int8 scales, then d last
        raw[:, -2:] = d
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0])
def test_exact_types_give_gguf_values_bit_for_bit(qtype):
    raw = random_blocks(qtype)
    qt = to_groupwise(raw, qtype, (N, K))
    assert (qt.bits, qt.group_size) == target(qtype)
    want = torch.from_numpy(gguf.quants.dequantize(raw, qtype)).reshape(N, K)
    assert torch.equal(dequantize(qt), want)
    assert qt.nbytes == held_nbytes(qtype, (N, K))


def test_q4_k_within_one_fp16_rounding_of_each_sub_block_scale_and_minimum():
    raw = random_blocks(T.Q4_K)
    qt = to_groupwise(raw, T.Q4_K, (N, K))
    assert (qt.bits, qt.group_size) == (4, 32)
    want = torch.from_numpy(gguf.quants.dequantize(raw, T.Q4_K)).reshape(N, K)
    got = dequantize(qt)
    # d·sc·q − dmin·m with d·sc and dmin·m each rounded once to fp16: |error| ≤ 2^-11 (|d·sc·q| + |dmin·m|)
    scale = qt.scales.float().repeat_interleave(32, dim=1)
    minimum = qt.minimums.float().repeat_interleave(32, dim=1)
    bound = 2.0**-11 * (scale * 15 + minimum.abs()) + 1e-7
    assert ((got - want).abs() <= bound).all()
    assert (got - want).abs().max() > 0  # the rounding is real: the test would see a wrong code or group


def test_q4_k_codes_are_in_column_order():
    """A single code set in sub-block 3 (the high nibbles of the second 32-byte run) lands in column 96 + j."""
    raw = random_blocks(T.Q4_K, n=1, k=256)
    raw[:, 16:] = 0
    raw[0, 16 + 32 + 5] = 0x70  # high nibble of byte 5 of run 1: sub-block 3, column 96 + 5
    qt = to_groupwise(raw, T.Q4_K, (1, 256))
    want = torch.from_numpy(gguf.quants.dequantize(raw, T.Q4_K)).reshape(1, 256)
    got = dequantize(qt)
    moved = (got - got[:, [0]]).abs().argmax().item()
    assert moved == 101 and (want - want[:, [96]]).abs().argmax().item() == 101


@pytest.mark.parametrize(
    ("qtype", "bits", "rel_rms"),
    [(T.Q5_0, 6, 0.03), (T.Q5_1, 6, 0.03), (T.Q6_K, 8, 0.006)],  # measured 0.022, 0.023; 0.004
)
def test_other_types_are_requantized_one_width_up(monkeypatch, qtype, bits, rel_rms):
    monkeypatch.setattr(gguf_blocks, "REQUANT_ROWS", 4)  # two slices of rows
    if qtype == T.Q6_K:
        raw = random_blocks(qtype)
    else:
        w = np.random.default_rng(1).standard_normal((N, K)).astype(np.float32)
        raw = gguf.quants.quantize(w, qtype)
    qt = to_groupwise(raw, qtype, (N, K))
    assert qt.bits == bits and qt.group_size == {6: 64, 8: 32}[bits]
    want = torch.from_numpy(gguf.quants.dequantize(raw, qtype)).reshape(N, K)
    err = (dequantize(qt) - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()
    assert err < rel_rms
    assert qt.nbytes == held_nbytes(qtype, (N, K))


def test_default_model_streams_its_blocks_packed_with_the_dense_values():
    """The embedded SmolLM2 GGUF (Q4_1 matrices, a Q8_0 table): every matrix streams packed, bit for bit
    the dense stream's values, Llama's Q/K rows moved back in place on the packed rows too."""
    src = open_source(default_model_path())
    dense = dict(src.weights())
    packed = dict(src.quantized_weights())
    rest = dict(src.unquantized_weights())
    assert set(packed) | set(rest) == set(dense) and not set(packed) & set(rest)
    assert all(t.dim() == 1 for t in rest.values())  # norms only
    assert packed["model.embed_tokens.weight"].bits == 8
    assert packed["model.layers.0.self_attn.q_proj.weight"].bits == 4
    for name, qt in packed.items():
        assert torch.equal(dequantize(qt), dense[name]), name


def test_a_matrix_goes_packed_only_in_groups_the_kernels_take():
    """Q5 blocks are held at 6 bits in groups of 64: a K of 96 would leave groups of 32, which the fused
    kernels refuse, so such a matrix loads dense; 4- and 8-bit groups of 32 fit any GGUF row."""
    assert kernel_takes(T.Q5_0, (8, 128)) and not kernel_takes(T.Q5_0, (8, 96))
    assert kernel_takes(T.Q4_K, (8, 256)) and kernel_takes(T.Q4_0, (8, 96)) and kernel_takes(T.F16, (8, 96))
    assert not kernel_takes(T.F32, (8, 4))  # a conv1d kernel [C, 4]
