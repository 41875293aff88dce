"""What holding a GGUF's blocks packed on a GPU costs (engine/formats/gguf_blocks.py), on the CPU that loads
them: per block type, the error of the type itself and of the width ninfer holds it at (relative RMS
against Gaussian float weights), and the seconds to_groupwise takes per billion weights, with the clipping
search beside round to nearest for the re-quantized types.

Types gguf can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) start from Gaussian weights; Q4_K and Q6_K, which it
cannot, from random blocks (timing only).

    python benchmarks/gguf_blocks.py [--rows 2048] [--cols 5120]
"""

from __future__ import annotations

import argparse
import platform
import time

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from engine.formats import gguf_blocks
from engine.quant.groupwise import dequantize, quantize


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def _random_k_blocks(qtype: T, rows: int, cols: int) -> np.ndarray:
    """Random Q4_K / Q6_K blocks with sane fp16 scales (Q4_K: d, dmin first; Q6_K: d last)."""
    rng = np.random.default_rng(0)
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // block, block_bytes), dtype=np.uint8)
    d = rng.uniform(1e-3, 1e-2, (len(raw), 1)).astype(np.float16).view(np.uint8)
    if qtype == T.Q4_K:
        raw[:, 0:2], raw[:, 2:4] = d, d
    else:
        raw[:, -2:] = d
    return raw.reshape(rows, -1)


def _seconds_per_billion(fn, raw: np.ndarray, qtype: T, shape: tuple[int, int]) -> float:
    """Seconds fn(raw, qtype, shape) takes per billion weights."""
    start = time.perf_counter()
    fn(raw, qtype, shape)
    return (time.perf_counter() - start) / (shape[0] * shape[1]) * 1e9


def _clipped(raw: np.ndarray, qtype: T, shape: tuple[int, int]) -> None:
    """The re-quantization as to_groupwise did it with groupwise's clipping search on (whole rows at once)."""
    bits, group = gguf_blocks.target(qtype)
    dense = torch.from_numpy(np.array(gguf.quants.dequantize(raw, qtype), dtype=np.float32)).reshape(shape)
    quantize(dense, bits, group, clip_search=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=5120)
    args = parser.parse_args()
    shape = (args.rows, args.cols)
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {shape[0]} x {shape[1]}"
    )
    print("| type | held at | type's error | held error | s per 1e9 weights | with clipping search |")
    print("|---|---|---|---|---|---|")
    w = torch.from_numpy(np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K):
        exact = qtype in gguf_blocks.EXACT
        if qtype in (T.Q4_K, T.Q6_K):
            raw, errors = _random_k_blocks(qtype, *shape), "— | —"
        else:
            raw = gguf.quants.quantize(w.numpy(), qtype)
            source = torch.from_numpy(gguf.quants.dequantize(raw, qtype)).reshape(shape)
            held = dequantize(gguf_blocks.to_groupwise(raw, qtype, shape))
            errors = f"{_rel(source, w):.2%} | {_rel(held, w):.2%}"
        bits, group = gguf_blocks.target(qtype)
        rtn = _seconds_per_billion(gguf_blocks.to_groupwise, raw, qtype, shape)
        clip = "—" if exact else f"{_seconds_per_billion(_clipped, raw, qtype, shape):.0f}"
        print(f"| {qtype.name} | {bits}-bit g{group} | {errors} | {rtn:.0f} | {clip} |")


if __name__ == "__main__":
    main()
