"""Aggregate decode tok/s on CPU at concurrency 1, 4 and 8: ninfer vs transformers `generate` (batched) in
the same process, and llama.cpp (llama-cpp-python, C1) on the same GGUF in its own venv, in the same run.

Decode rate excludes prefill: tg = C x (N - 1) / (t(N tokens) - t(1 token)), greedy, fixed length (no
EOS), C distinct prompts of equal length, median over repeats. Prefix caching is off for ninfer so every
run prefills from scratch, as the others do. Prints each rate and the ratios the targets name.

    python benchmarks/cpu_throughput.py [--tokens 64] [--repeat 3] [--concurrency 1,4,8]
    bash benchmarks/setup_llamacpp.sh   # once, ~6 min: builds .venv-llamacpp for the llama.cpp column
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine import LLM, SamplingParams
from engine.models.loader import default_model_path

ROOT = Path(__file__).resolve().parent.parent
LLAMACPP_PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]

# runs inside .venv-llamacpp: argv = gguf path, tokens, repeat, prompt ids as JSON; prints the tok/s
LLAMACPP_SCRIPT = r"""
import json, statistics, sys, time
from llama_cpp import Llama
path, n, repeat, ids = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = Llama(model_path=path, n_ctx=2048, n_threads=int(sys.argv[5]), n_batch=512, verbose=False)
def run(k):
    t0 = time.perf_counter()
    for i, _ in enumerate(llm.generate(ids, temp=0.0, reset=True)):
        if i + 1 == k:
            break
    return time.perf_counter() - t0
run(2)
rates = []
for _ in range(repeat):
    t1, tn = run(1), run(n)
    rates.append((n - 1) / (tn - t1))
print(json.dumps({"rate": statistics.median(rates), "version": __import__("llama_cpp").__version__}))
"""


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_rate(run, concurrency: int, n: int, repeat: int) -> float:
    run(2)  # warm-up
    rates = []
    for _ in range(repeat):
        t1, tn = _timed(lambda: run(1)), _timed(lambda: run(n))
        rates.append(concurrency * (n - 1) / (tn - t1))
    return statistics.median(rates)


def distinct_prompts(ids: list[int], count: int) -> list[list[int]]:
    """`count` prompts of the same length that share no prefix (a different first token each)."""
    return [[ids[0] + i, *ids[1:]] for i in range(count)]


def llamacpp_rate(path: Path, ids: list[int], n: int, repeat: int) -> tuple[float, str] | None:
    if not LLAMACPP_PYTHON.exists():
        print("llama.cpp     (skipped: run `bash benchmarks/setup_llamacpp.sh` to build .venv-llamacpp)")
        return None
    cmd = [
        str(LLAMACPP_PYTHON),
        "-c",
        LLAMACPP_SCRIPT,
        str(path),
        str(n),
        str(repeat),
        json.dumps(ids),
        str(torch.get_num_threads()),
    ]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["rate"], out["version"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--weight-quant", default="auto", help="ninfer's weight_quant (auto, none, int8, int4)")
    ap.add_argument("--dtype", default="float32", help="ninfer's activation dtype (float32, bfloat16)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from transformers import AutoModelForCausalLM

    path = default_model_path()
    llm = LLM(
        max_concurrency=max(levels),
        enable_prefix_caching=False,
        weight_quant=args.weight_quant,
        dtype=args.dtype,
    )
    ids = llm.tokenizer.encode_chat(MESSAGES)
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None

    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"model: {path.name}; ninfer {args.dtype} weight_quant={args.weight_quant}, transformers fp32; prompt {len(ids)} "
        f"tokens, decode {args.tokens} tokens, median of {args.repeat}"
    )
    ours: dict[int, float] = {}
    theirs: dict[int, float] = {}
    for c in levels:
        prompts = distinct_prompts(ids, c)

        def run_ours(n: int, prompts=prompts) -> None:
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
            assert all(len(o.token_ids) == n for o in outs)

        batch = torch.tensor(prompts)

        def run_hf(n: int, batch=batch) -> None:
            with torch.inference_mode():
                out = hf.generate(batch, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            assert out.shape[1] == len(ids) + n

        ours[c] = decode_rate(run_ours, c, args.tokens, args.repeat)
        theirs[c] = decode_rate(run_hf, c, args.tokens, args.repeat)
        print(
            f"C{c}: ninfer {ours[c]:7.1f} tok/s   transformers {theirs[c]:7.1f} tok/s   "
            f"ratio {ours[c] / theirs[c]:5.2f}x"
        )
    llama = llamacpp_rate(path, ids, args.tokens, args.repeat)
    first, last = levels[0], levels[-1]
    print(f"ninfer C{last} / ninfer C{first}:        {ours[last] / ours[first]:5.2f}x")
    if llama is not None:
        rate, version = llama
        print(f"llama.cpp C1 (llama-cpp-python {version}): {rate:7.1f} tok/s")
        print(f"ninfer C{first} / llama.cpp C1:      {ours[first] / rate:5.2f}x")
        print(f"ninfer C{last} / llama.cpp C1:      {ours[last] / rate:5.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
