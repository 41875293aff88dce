"""The sampler's host time per step for penalties and DRY, by context length, against the way penalties were
read before (a set of the whole prompt and output, sorted, every step), same process, same history.

History: a code-like token stream (half the tokens from a few thousand frequent ids, half from a 150K
vocabulary) of N prompt tokens plus 1,000 generated; one [1, 151,936] logits row on the CPU. Rows:
- `baseline`: the repetition penalty as it was computed (sorted(set(prompt) | set(output)) per step);
- `repetition`: engine/sample/penalties.py's (the prompt's distinct tokens kept from the first step);
- `dry`: DRY over the whole context (dry_penalty_last_n -1, the four default breakers);
- `both`: repetition penalty, presence penalty and DRY together, as a llama.cpp preset sends them.

    python benchmarks/sampler_penalties.py [--contexts 8192,32768,131072,180000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch

from engine.request import Request, SamplingParams
from engine.sample.dry import DryBreakers
from engine.sample.penalties import penalize
from engine.transfer import to_device

VOCAB = 151_936


def baseline(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]
) -> torch.Tensor:
    """The repetition penalty as the sampler computed it before: the seen set rebuilt every step."""
    logits = logits.clone()
    seen = to_device(sorted(set(prompt) | set(output)), torch.long, logits.device)
    vals = logits[0, seen]
    logits[0, seen] = torch.where(
        vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty
    )
    return logits


def ms_per_call(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="8192,32768,131072,180000")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    rng = random.Random(0)
    logits = torch.randn(1, VOCAB)
    breakers = np.zeros(VOCAB, dtype=bool)
    breakers[rng.sample(range(VOCAB), 6000)] = True  # ~4% of a Qwen vocabulary holds "\n", ":", '"' or "*"
    print("| context | baseline ms | repetition ms | speed-up | dry ms | all three ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (int(c) for c in args.contexts.split(",")):
        stream = [
            rng.randrange(3000) if rng.random() < 0.5 else rng.randrange(VOCAB) for _ in range(n + 1000)
        ]
        req = Request("r", stream[:n], SamplingParams(), dry_breakers=DryBreakers(breakers))
        req.output_token_ids = stream[n:]
        old, new, dry, both = timings(req, logits, args.repeat)
        print(f"| {n:,} | {old:.2f} | {new:.2f} | {old / new:.1f}x | {dry:.2f} | {both:.2f} |")


def timings(req: Request, logits: torch.Tensor, repeat: int) -> tuple[float, ...]:
    """ms per step: the baseline, the repetition penalty, DRY, and the three together."""
    history = req.token_history()
    rep = SamplingParams(repetition_penalty=1.05)
    dry = SamplingParams(dry_multiplier=0.8)
    both = SamplingParams(repetition_penalty=1.05, presence_penalty=0.5, dry_multiplier=0.8)
    return (
        ms_per_call(lambda: baseline(logits, rep, req.prompt_token_ids, req.output_token_ids), repeat),
        *(ms_per_call(lambda p=p: penalize(logits, [p], [history]), repeat) for p in (rep, dry, both)),
    )


if __name__ == "__main__":
    main()
