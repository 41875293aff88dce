"""The CPU int4 matmul: ninfer's native kernel (kernels/q4_cpu: AVX-512 VNNI, or AVX2 where the CPU has no
AVX-512) against torch's int4 kernel (`_weight_int4pack_mm_for_cpu`, what runs without it), side by side
in one process.

First each int4 layer shape of the embedded default model at M = 1, 2 and 8 rows: microseconds a call
(median of --repeat, the two kernels alternating) and their ratio; then decode of the model itself with
either kernel in its int4 layers: tg = (N - 1) / (t(N) - t(1)), greedy, median of --repeat, alternating.

    python benchmarks/cpu_int4.py [--tokens 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import ninfer_kernels.q4_cpu as q4_cpu
from engine import LLM, SamplingParams
from engine.quant.cpu import CpuInt4Weight

# (N, K) of the default model's int4 layers: qkv, o, gate + up, down
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
ROWS = (1, 2, 8)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def _simd() -> str:
    flags = next(
        (ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), ""
    ).split()
    return "AVX-512 VNNI" if "avx512_vnni" in flags else ("AVX2" if "avx2" in flags else "neither")


def _weights(w: torch.Tensor) -> tuple[CpuInt4Weight, CpuInt4Weight]:
    native = CpuInt4Weight(w)
    available = q4_cpu.available
    q4_cpu.available = lambda: False  # what CpuInt4Weight checks: torch's kernel instead
    try:
        fallback = CpuInt4Weight(w)
    finally:
        q4_cpu.available = available
    return native, fallback


def _call_us(layer: CpuInt4Weight, x: torch.Tensor, calls: int = 50) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        layer(x)
    return (time.perf_counter() - start) / calls * 1e6


def _decode_rate(llm: LLM, n: int) -> float:
    def run(tokens: int) -> float:
        params = SamplingParams(
            max_tokens=tokens, temperature=0.0, logit_bias={t: -100 for t in llm.eos_token_ids}
        )
        start = time.perf_counter()
        llm.chat(MESSAGES, params)
        return time.perf_counter() - start

    return (n - 1) / (run(n) - run(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if not q4_cpu.available():
        raise SystemExit("the native int4 kernel is not built on this CPU (it needs AVX-512 VNNI or AVX2)")
    print(f"# {_simd()} CPU, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| N x K | M | native us | torch int4 us | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        native, fallback = _weights(torch.randn(n, k, generator=gen) * 0.05)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen)
            times: dict[str, list[float]] = {"native": [], "torch": []}
            for _ in range(args.repeat):
                times["native"].append(_call_us(native, x))
                times["torch"].append(_call_us(fallback, x))
            a, b = statistics.median(times["native"]), statistics.median(times["torch"])
            print(f"| {n} x {k} | {m} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    llm_native = LLM()
    available = q4_cpu.available
    q4_cpu.available = lambda: False
    try:
        llm_torch = LLM()
    finally:
        q4_cpu.available = available
    rates: dict[str, list[float]] = {"native": [], "torch": []}
    for _ in range(args.repeat):
        rates["native"].append(_decode_rate(llm_native, args.tokens))
        rates["torch"].append(_decode_rate(llm_torch, args.tokens))
    a, b = statistics.median(rates["native"]), statistics.median(rates["torch"])
    print(f"\n{llm_native.description}: decode {args.tokens} tokens, greedy, median of {args.repeat}")
    print(f"native int4 {a:.1f} tok/s, torch int4 {b:.1f} tok/s: {a / b:.2f}x")


if __name__ == "__main__":
    main()
