"""Aggregate decode tok/s on CPU at concurrency 1, 4 and 8: ninfer vs transformers `generate` (batched) in
the same process, and llama.cpp (llama-cpp-python, C1) on the same GGUF in its own venv, in the same run.

Decode rate excludes prefill: tg = C x (N - 1) / (t(N tokens) - t(1 token)), greedy, fixed length (no
EOS), C distinct prompts of equal length, median over repeats. Prefix caching is off for ninfer so every
run prefills from scratch, as the others do. Prints each rate and the ratios the targets name; the ratios
of two rates (ninfer C1 / llama.cpp C1, ninfer C8 / ninfer C1) also from runs that alternate round by
round, since this VM's speed drifts between minutes.

    python benchmarks/cpu_throughput.py [--tokens 64] [--repeat 3] [--concurrency 1,4,8] [--prefill 1024]
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

# runs inside .venv-llamacpp as a worker: argv = gguf path, prompt ids as JSON, threads, context; for each
# line "K" on stdin it generates K tokens greedily from the prompt and prints the seconds it took.
# llama-cpp-python keeps the prompt's KV between calls (`generate` reuses a matching prefix), so "K cold"
# first empties it: the prefill is then timed too (decode rates difference it away either way)
LLAMACPP_WORKER = r"""
import json, sys, time
from llama_cpp import Llama
path, ids = sys.argv[1], json.loads(sys.argv[2])
llm = Llama(model_path=path, n_ctx=int(sys.argv[4]), n_threads=int(sys.argv[3]), n_batch=512, verbose=False)
print(json.dumps({"version": __import__("llama_cpp").__version__}), flush=True)
for line in sys.stdin:
    k, *cold = line.split()
    k = int(k)
    if cold:
        llm.reset()
    t0 = time.perf_counter()
    for i, _ in enumerate(llm.generate(ids, temp=0.0, reset=True)):
        if i + 1 == k:
            break
    print(time.perf_counter() - t0, flush=True)
"""


class LlamaCpp:
    """llama.cpp on the same GGUF in its own venv, kept running so its runs can alternate with ninfer's."""

    def __init__(self, path: Path, ids: list[int]):
        cmd = [
            str(LLAMACPP_PYTHON),
            "-c",
            LLAMACPP_WORKER,
            str(path),
            json.dumps(ids),
            str(torch.get_num_threads()),
            str(max(2048, len(ids) + 256)),
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = json.loads(self.proc.stdout.readline())["version"]

    def run(self, n: int, cold: bool = False) -> None:
        self.proc.stdin.write(f"{n} cold\n" if cold else f"{n}\n")
        self.proc.stdin.flush()
        float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


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


def paired(run_a, ca: int, run_b, cb: int, n: int, repeat: int) -> tuple[float, float, float]:
    """Two runners (at concurrency ca and cb) measured in alternation, round by round, so a drift in the
    machine's speed reaches both: (rate a, rate b, median of the per-round ratios a / b)."""
    run_a(2)
    run_b(2)
    rates_a, rates_b, ratios = [], [], []
    for _ in range(repeat):
        for run, c, rates in ((run_a, ca, rates_a), (run_b, cb, rates_b)):
            t1, tn = _timed(lambda run=run: run(1)), _timed(lambda run=run: run(n))
            rates.append(c * (n - 1) / (tn - t1))
        ratios.append(rates_a[-1] / rates_b[-1])
    return statistics.median(rates_a), statistics.median(rates_b), statistics.median(ratios)


def prefill_rates(llm, path: Path, ids: list[int], length: int, repeat: int) -> None:
    """Prompt tok/s of ninfer and llama.cpp on one `length`-token prompt (the chat prompt repeated), the
    time to a first token, rounds alternating; prints both and the median of the per-round ratios."""
    prompt = (ids * (length // len(ids) + 1))[:length]
    llama = LlamaCpp(path, prompt)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    runs = {
        "ninfer": lambda: llm.generate(prompt_token_ids=[prompt], sampling_params=params),
        "llama.cpp": lambda: llama.run(1, cold=True),
    }
    for run in runs.values():
        run()  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            rates[name].append(length / _timed(run))
    llama.close()
    ratio = statistics.median(a / b for a, b in zip(rates["ninfer"], rates["llama.cpp"]))
    ours, theirs = statistics.median(rates["ninfer"]), statistics.median(rates["llama.cpp"])
    print(
        f"prefill {length} tokens: ninfer {ours:7.1f} tok/s   llama.cpp {theirs:7.1f} tok/s   "
        f"ratio {ratio:5.2f}x (median of the per-round ratios; time to the first token)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--weight-quant", default="auto", help="ninfer's weight_quant (auto, none, int8, int4)")
    ap.add_argument("--dtype", default="float32", help="ninfer's activation dtype (float32, bfloat16)")
    ap.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="also time the prefill of a prompt this long against llama.cpp (0: off)",
    )
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
    llama = None
    if LLAMACPP_PYTHON.exists():
        llama = LlamaCpp(path, ids)
    else:
        print("llama.cpp     (skipped: run `bash benchmarks/setup_llamacpp.sh` to build .venv-llamacpp)")
    ours: dict[int, float] = {}
    theirs: dict[int, float] = {}
    with_llama: tuple[float, float, float] | None = None

    def runner(c: int):
        prompts = distinct_prompts(ids, c)

        def run_ours(n: int) -> None:
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
            assert all(len(o.token_ids) == n for o in outs)

        return run_ours

    for c in levels:
        batch = torch.tensor(distinct_prompts(ids, c))

        def run_hf(n: int, batch=batch) -> None:
            with torch.inference_mode():
                out = hf.generate(batch, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            assert out.shape[1] == len(ids) + n

        if c == 1 and llama is not None:
            with_llama = paired(runner(1), 1, llama.run, 1, args.tokens, args.repeat)
            ours[c] = with_llama[0]
        else:
            ours[c] = decode_rate(runner(c), c, args.tokens, args.repeat)
        theirs[c] = decode_rate(run_hf, c, args.tokens, args.repeat)
        print(
            f"C{c}: ninfer {ours[c]:7.1f} tok/s   transformers {theirs[c]:7.1f} tok/s   "
            f"ratio {ours[c] / theirs[c]:5.2f}x"
        )
    if llama is not None and with_llama is None:  # the llama.cpp ratios need a paired ninfer C1
        with_llama = paired(runner(1), 1, llama.run, 1, args.tokens, args.repeat)
    first, last = levels[0], levels[-1]
    print(f"ninfer C{last} / ninfer C{first}:        {ours[last] / ours[first]:5.2f}x (of the rates above)")
    if last != first:
        scaling = paired(runner(last), last, runner(first), first, args.tokens, args.repeat)
        print(
            f"ninfer C{last} / ninfer C{first}:        {scaling[2]:5.2f}x (median of the per-round ratios, "
            f"C{last} and C{first} alternating: {scaling[0]:.1f} and {scaling[1]:.1f} tok/s)"
        )
    if llama is not None and args.prefill:
        prefill_rates(llm, path, ids, args.prefill, args.repeat)
    if llama is not None:
        llama.close()
        rate = with_llama[1]
        print(
            f"llama.cpp C1 (llama-cpp-python {llama.version}): {rate:7.1f} tok/s (runs alternating with ninfer C1)"
        )
        print(f"ninfer C1 / llama.cpp C1:      {with_llama[2]:5.2f}x (median of the per-round ratios)")
        print(f"ninfer C{last} / llama.cpp C1:      {ours[last] / rate:5.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
