"""What reading a checkpoint another tool quantized costs the CPU that loads it (engine/formats/hf_intq.py,
engine/formats/hf_quant.py): seconds per billion weights to turn one layer's stored tensors into what the
engine holds (ninfer's 4- / 8-bit groups, FP8 dequantized to bf16, NVFP4 as stored), beside the baseline of the same
process: quantizing the same matrix from 16 bits at that width (groupwise.quantize, round to nearest), what
serving the bf16 checkpoint at that width would cost instead.

The stored tensors are random words and scales of the right shapes and dtypes (timing only).

    python benchmarks/quantized_checkpoints.py [--rows 17408] [--cols 5120]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch

from engine.formats.hf_fp4 import CT as FP4_CT
from engine.formats.hf_fp4 import Fp4Scheme, dequantized, fp4_tensor
from engine.formats.hf_intq import CT, INT8, IntScheme, to_groupwise
from engine.formats.hf_quant import dequantize_scaled
from engine.quant.groupwise import quantize

GROUP = 128
NVFP4 = Fp4Scheme(FP4_CT)


def _words(*shape: int) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32)


def _layouts(n: int, k: int) -> dict[str, tuple[int, Callable[[], object]]]:
    """name -> (bits, a function doing the load-time work once)."""
    g = k // GROUP
    scales_kn, scales_nk = torch.rand(g, n).half(), torch.rand(n, g).half()
    awq = {"qweight": _words(k, n // 8), "qzeros": _words(g, n // 8), "scales": scales_kn}
    gptq = {"qweight": _words(k // 8, n), "qzeros": _words(g, n // 8), "scales": scales_kn}
    scattered = torch.argsort(torch.randperm(k)) // GROUP  # act-order: each column's group, scattered
    gptq_act_order = {**gptq, "g_idx": scattered.to(torch.int32)}
    ct4 = {"weight_packed": _words(n, k // 8), "weight_scale": scales_nk}
    zeros128 = torch.full((g, n // 4), 0x80808080 - 2**32, dtype=torch.int32)  # every zero point 128
    gptq8 = {"qweight": _words(k // 4, n), "qzeros": zeros128, "scales": scales_kn}
    w8a8 = {"weight": torch.randint(-127, 128, (n, k), dtype=torch.int8), "weight_scale": torch.rand(n, 1)}
    fp8 = torch.randn(n, k).to(torch.float8_e4m3fn)
    fp8_scales = torch.rand(-(-n // 128), -(-k // 128))
    nvfp4 = {
        "w.weight_packed": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
        "w.weight_scale": (torch.rand(n, k // 16) + 0.1).to(torch.float8_e4m3fn),
        "w.weight_global_scale": torch.tensor([448.0 * 6]),
    }
    return {
        "AWQ 4-bit": (4, lambda: to_groupwise(awq, IntScheme("awq", GROUP, 0), "w")),
        "GPTQ 4-bit": (4, lambda: to_groupwise(gptq, IntScheme("gptq", GROUP, 1), "w")),
        "GPTQ 4-bit act-order (columns sorted by group)": (
            4,
            lambda: to_groupwise(gptq_act_order, IntScheme("gptq", GROUP, 1, act_order=True), "w"),
        ),
        "compressed-tensors 4-bit": (4, lambda: to_groupwise(ct4, IntScheme(CT, GROUP, 0), "w")),
        "GPTQ 8-bit": (8, lambda: to_groupwise(gptq8, IntScheme("gptq", GROUP, 0, 8), "w")),
        "compressed-tensors W8A8 (a scale a row)": (
            8,
            lambda: to_groupwise(w8a8, IntScheme(INT8, -1, 0, 8), "w"),
        ),
        "FP8 128 x 128 blocks -> bf16": (16, lambda: dequantize_scaled(fp8, fp8_scales, (128, 128))),
        # NVFP4 (llm-compressor's): held as stored on a GPU since the FP4 kernel; before it, dequantized to
        # bf16 as it streamed (then rounded into 8-bit groups on the GPU)
        "NVFP4 held as stored (codes, scale bytes)": (4, lambda: fp4_tensor("w", nvfp4.get, NVFP4)),
        "NVFP4 -> bf16 (as it streamed before the FP4 kernel)": (16, lambda: fp4_bf16(nvfp4)),
    }


def fp4_bf16(stored: dict[str, torch.Tensor]) -> torch.Tensor:
    """The layer as engine/formats/hf_fp4.dequantized streams it (to bf16)."""
    return next(dequantized(iter([("w.weight_packed", stored["w.weight_packed"])]), stored.get, NVFP4))[1]


def _seconds(work, repeat: int) -> float:
    work()  # (first touch of the inputs)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=17408)
    parser.add_argument("--cols", type=int, default=5120)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, k = args.rows, args.cols
    per_billion = 1e9 / (n * k)
    print(f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; {n} x {k}")
    bf16 = torch.randn(n, k).to(torch.bfloat16)
    baseline = {
        bits: _seconds(lambda b=bits: quantize(bf16, b, GROUP, clip_search=False), args.repeat)
        for bits in (4, 8)
    }
    print("| layout | s per 1e9 weights | baseline: quantized from bf16 | ratio |")
    print("|---|---|---|---|")
    for name, (bits, work) in _layouts(n, k).items():
        took = _seconds(work, args.repeat) * per_billion
        if bits in baseline:
            base = baseline[bits] * per_billion
            print(f"| {name} | {took:.2f} | {base:.2f} ({bits}-bit, round to nearest) | {took / base:.3f} |")
        else:
            print(f"| {name} | {took:.2f} | — | — |")


if __name__ == "__main__":
    main()
