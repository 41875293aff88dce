"""What `n` choices save by waiting for their first to run the shared prompt (Request.after): the time to
all n replies, and the prompt tokens computed, against the same n requests queued independently, same
process, side by side.

Each run queues n requests for one long prompt at once (temperature 1, seeds 0..n-1, a few tokens each,
the end token biased away so every reply has the same length). "independent": every request computes the
prompt itself (each is admitted before any page of the prompt is in the prefix cache). "after the first":
the others wait until the first has run the prompt, then take its pages from the prefix cache. Median of
the repeats; prints the times and their ratio.

    python benchmarks/shared_prompt_choices.py [--prompt-tokens 2000] [--n 4] [--gen 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import LLM, SamplingParams


def run(llm: LLM, prompt: list[int], n: int, gen: int, shared: bool) -> tuple[float, int]:
    """(seconds to every reply, prompt tokens computed) for n requests of one prompt (not seen before: a cold
    prefix cache) queued at once."""
    t0 = time.perf_counter()
    first = None
    ids = []
    for seed in range(n):
        params = SamplingParams(
            max_tokens=gen, temperature=1.0, seed=seed, logit_bias={t: -100 for t in llm.eos_token_ids}
        )
        rid = llm.add_request(prompt, params, after=first if shared else None)
        first = first or rid
        ids.append(rid)
    outs = {}
    while llm.has_unfinished_requests():
        outs.update({o.request_id: o for o, _ in llm.step() if o.finished})
    seconds = time.perf_counter() - t0
    assert all(len(outs[r].token_ids) == gen for r in ids)
    return seconds, sum(len(prompt) - outs[r].num_cached_tokens for r in ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    llm = LLM(device=args.device, max_concurrency=args.n, max_context=args.prompt_tokens + args.gen + 64)
    gen = torch.Generator().manual_seed(0)

    def prompt() -> list[int]:  # random token ids: each run's prompt is new to the prefix cache
        return torch.randint(100, llm.model_config.vocab_size, (args.prompt_tokens,), generator=gen).tolist()

    print(
        f"{llm.description}, {args.device}, n {args.n}, {args.prompt_tokens}-token prompts, {args.gen} tokens each"
    )
    rows = {}
    for label, shared in (("independent", False), ("after the first", True)):
        runs = [run(llm, prompt(), args.n, args.gen, shared) for _ in range(args.repeat)]
        rows[label] = statistics.median(s for s, _ in runs), runs[0][1]
    base = rows["independent"][0]
    for label, (seconds, computed) in rows.items():
        print(f"{label:<18} {seconds:7.2f} s  {computed:>7,} prompt tokens computed  {base / seconds:5.2f}x")


if __name__ == "__main__":
    main()
