"""Perplexity of the embedded SmolLM2 model under every `ninfer convert` recipe, against the dequantized
source (the GGUF's weights in fp32) as the reference, on a fixed English text that ships with Python.

Text: the topics of Python's own documentation (`pydoc_data.topics`, sorted by name, joined by blank
lines), its first --tokens tokens, scored in windows of --window tokens (each window scored from its
first token, no overlap). Every engine runs weight_quant=none, so a recipe's own rounding is what is
measured. Prints bits/weight, perplexity and the change against the reference.

--int8-act scores each quantized recipe a second time as `--int8-prefill` computes prompt chunks on a GPU:
every linear layer but the head (a prompt's last-position logits take the 16-bit GEMV) multiplies its
input quantized to int8 per token and per group of its own weight (kernels/int8_act's naive twin), by
the same dequantized weight: the int8 kernel's numbers, on the CPU.

    python benchmarks/quant_quality.py [--tokens 24576] [--window 1024] [--recipes q4.6,w4g128,w6g128,w8g128,bf16]
        [--int8-act]
"""

from __future__ import annotations

import argparse
import math
import platform
import pydoc_data.topics
import sys
import tempfile
import time
from pathlib import Path

import torch

from engine import LLM
from engine.layers.linear import Linear, MergedLinear
from engine.models.loader import default_model_path, open_source
from engine.quant.calibration import sequence_logprobs
from engine.quant.convert import convert
from engine.quant.layer import INT8_MIN_ROWS, int8_kernel_takes
from ninfer_kernels.int8_act.naive import dequantize_act, quantize_act


def corpus() -> str:
    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def perplexity(llm: LLM, tokens: list[int], window: int) -> float:
    nll, count = 0.0, 0
    for start in range(0, len(tokens) - 1, window):
        chunk = tokens[start : start + window + 1]
        if len(chunk) < 2:
            break
        lp = sequence_logprobs(llm, chunk[:-1])  # [W, V]
        target = torch.tensor(chunk[1:])
        nll -= lp.gather(1, target[:, None]).sum().item()
        count += len(chunk) - 1
    return math.exp(nll / count)


def int8_activation_hooks(llm: LLM, artifact: Path) -> list:
    """Forward hooks that recompute each linear layer of `llm` (dense, dequantized weights) but the head
    with int8 activations, as --int8-prefill's kernels do on a GPU: rows of the output whose weight the GPU
    keeps packed with groups of 32+ take x quantized per (token, group of that weight); the rest keep x.
    Steps of fewer than INT8_MIN_ROWS rows (the GEMV's) are left alone. Returns the hook handles."""
    model = llm.model
    params = dict(model.named_parameters())
    segments: dict[Linear, list[tuple[int, int, int]]] = {}  # module -> [(first row, rows, group or 0)]
    for name, qt in open_source(artifact).quantized_weights():
        mapped = model.param_for(name)
        if mapped is None or mapped[0] == "lm_head.weight":
            continue
        users = [m for m in model.modules() if isinstance(m, Linear) and m.weight is params.get(mapped[0])]
        for module in users:
            start, rows = module.offsets[mapped[1]] if isinstance(module, MergedLinear) else (0, qt.shape[0])
            int8 = int8_kernel_takes(qt.bits, qt.group_size)
            segments.setdefault(module, []).append((start, rows, qt.group_size if int8 else 0))

    def hook(module, args, out):
        x = args[0]
        if x.shape[0] < INT8_MIN_ROWS:
            return None
        parts = []
        for start, rows, group in sorted(segments[module]):
            xi = x if not group else dequantize_act(*quantize_act(x, group)[:2])[:, : x.shape[1]].to(x.dtype)
            parts.append(xi @ module.weight[start : start + rows].t())
        y = torch.cat(parts, dim=-1)
        return y if module.bias is None else y + module.bias

    return [module.register_forward_hook(hook) for module in segments]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=24576)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--recipes", default="q4.6,w4g128,w6g128,w8g128,bf16")
    ap.add_argument(
        "--methods", default="gptq", help="convert's methods to score each recipe with: gptq, rtn"
    )
    ap.add_argument(
        "--int8-act",
        action="store_true",
        help="also score each recipe with --int8-prefill's int8 activations",
    )
    args = ap.parse_args()
    src = default_model_path()
    options = dict(
        weight_quant="none", enable_prefix_caching=False, max_concurrency=1, max_context=args.window + 8
    )
    reference = LLM(src, **options)
    tokens = reference.tokenizer.encode(corpus(), add_special_tokens=False)[: args.tokens]
    print(
        f"python {sys.version.split()[0]} pydoc_data.topics, {len(tokens)} tokens, windows of {args.window}"
    )
    print(f"machine: {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    t0 = time.perf_counter()
    base = perplexity(reference, tokens, args.window)
    print(
        f"{'source (GGUF Q4_1/Q8_0 dequantized)':38s} ppl {base:8.3f}   ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    del reference
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(r, m) for r in args.recipes.split(",") for m in args.methods.split(",")]
        for recipe, method in runs:
            if recipe == "bf16" and method != runs[0][1]:
                continue  # nothing to quantize: one bf16 row
            label = recipe if recipe == "bf16" else f"{recipe} {method}"
            out = Path(tmp) / f"smollm2-{recipe}-{method}.ninfer"
            t0 = time.perf_counter()
            rows = convert(src, out, recipe, method=method)
            weights = sum(r["bytes"] * 8 / r["bits_per_weight"] for r in rows if r["bits_per_weight"])
            matrix_rows = [r for r in rows if r["kind"].endswith("weight") and r["bits"] not in ("32",)]
            matrix_bits = sum(r["bytes"] * 8 for r in matrix_rows) / max(
                sum(r["bytes"] * 8 / r["bits_per_weight"] for r in matrix_rows), 1
            )
            llm = LLM(out, **options)
            ppl = perplexity(llm, tokens, args.window)
            print(
                f"{label:38s} ppl {ppl:8.3f}   {100 * (ppl / base - 1):+6.2f}%   "
                f"{matrix_bits:5.2f} bits/weight (matrices), {out.stat().st_size / 2**20:6.1f} MiB, "
                f"{weights / 1e6:.0f}M weights   ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
            if args.int8_act and recipe != "bf16":
                t0 = time.perf_counter()
                hooks = int8_activation_hooks(llm, out)
                ppl8 = perplexity(llm, tokens, args.window)
                for h in hooks:
                    h.remove()
                print(
                    f"{'  + int8 activations':38s} ppl {ppl8:8.3f}   {100 * (ppl8 / base - 1):+6.2f}%   "
                    f"{100 * (ppl8 / ppl - 1):+6.2f}% vs 16-bit activations, {len(hooks)} layers   "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
            del llm


if __name__ == "__main__":
    main()
