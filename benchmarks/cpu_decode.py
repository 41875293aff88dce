"""Decode tok/s of ninfer vs transformers `generate` on the embedded default model, same process, same run.

Decode rate excludes prefill: tg = (N - 1) / (t(N tokens) - t(1 token)), greedy, fixed length (no EOS),
median over repeats. Prints both rates and their ratio.

    python benchmarks/cpu_decode.py [--tokens 128] [--repeat 3] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from engine import LLM, SamplingParams
from engine.models.loader import default_model_path

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def decode_rate(run, n: int, repeat: int) -> float:
    run(2)  # warm-up
    rates = []
    for _ in range(repeat):
        t1, tn = _timed(lambda: run(1)), _timed(lambda: run(n))
        rates.append((n - 1) / (tn - t1))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    llm = LLM(device="cpu", dtype="float32", max_concurrency=1)
    ids = llm.tokenizer.encode_chat(MESSAGES)

    def ours(n: int) -> None:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        out = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
        assert len(out.token_ids) == n

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    prompt = torch.tensor([ids])

    def reference(n: int) -> None:
        with torch.inference_mode():
            out = hf.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0)
        assert out.shape[1] == len(ids) + n

    ninfer_rate = decode_rate(ours, args.tokens, args.repeat)
    hf_rate = decode_rate(reference, args.tokens, args.repeat)
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"model: {path.name} (fp32 on CPU), prompt {len(ids)} tokens, decode {args.tokens} tokens, median of {args.repeat}"
    )
    print(f"ninfer        {ninfer_rate:8.1f} tok/s")
    print(f"transformers  {hf_rate:8.1f} tok/s")
    print(f"ratio         {ninfer_rate / hf_rate:8.2f}x")


if __name__ == "__main__":
    main()
