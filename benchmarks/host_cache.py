"""What the host tier (`--host-cache`) saves a conversation whose prefix the KV pool evicted: the time to
the first token of its next request, and the prompt tokens computed, with the tier against without it,
same process, side by side.

Each run: conversation A (a long prompt, a few tokens), then B (another as long; the pool holds one of
them, so B's pages take A's), then A again with a few new tokens at its end (its next turn). Without the
tier A's prefix is gone and computed again; with it, A's pages come back from host memory. Median of the
repeats; prints the times and their ratio.

    python benchmarks/host_cache.py [--prompt-tokens 2000] [--repeat 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import LLM, SamplingParams

GEN = 4


def run(llm: LLM, a: list[int], b: list[int], turn: list[int]) -> tuple[float, int]:
    """(seconds to A's next turn's first token, its prompt tokens computed) after A, then B."""
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True)
    llm.generate(prompt_token_ids=a, sampling_params=params)
    llm.generate(prompt_token_ids=b, sampling_params=params)
    t0 = time.perf_counter()
    rid = llm.add_request(a + turn, SamplingParams(max_tokens=1, temperature=0.0))
    while True:
        done = [o for o, _ in llm.step() if o.request_id == rid and o.finished]
        if done:
            return time.perf_counter() - t0, len(a) + len(turn) - done[0].num_cached_tokens


def count_copies(llm: LLM) -> dict[str, int]:
    """Pages swapped in and the slice copies (a tensor) that moved them, over the runs (engine/worker/host_kv.py
    coalesces pages and slots that run on together)."""
    from engine.worker.host_kv import page_runs

    counts = {"pages": 0, "slices": 0}
    host, copy = llm.runner.host_kv, llm.runner.host_kv.copy

    def counted(swap_out, swap_in):
        counts["pages"] += len(swap_in)
        counts["slices"] += len(page_runs(swap_in))
        copy(swap_out, swap_in)

    host.copy = counted
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    context = args.prompt_tokens + 64
    # the pool holds one conversation, not two: B evicts A
    options = dict(device=args.device, max_concurrency=1, max_context=context, kv_capacity=context)
    llms = {"recomputed": LLM(**options), "host tier": LLM(**options, host_cache=1 << 30)}
    copies = count_copies(llms["host tier"])
    vocab = llms["recomputed"].model_config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:  # random token ids: each run's prompts are new to the prefix cache
        return torch.randint(100, vocab, (n,), generator=gen).tolist()

    print(f"{llms['recomputed'].description}, {args.device}, {args.prompt_tokens}-token conversations")
    rows = {label: [] for label in llms}
    for _ in range(args.repeat):
        a, b, turn = tokens(args.prompt_tokens), tokens(args.prompt_tokens), tokens(20)
        for label, llm in llms.items():
            rows[label].append(run(llm, a, b, turn))
    base = statistics.median(s for s, _ in rows["recomputed"])
    for label, runs in rows.items():
        seconds = statistics.median(s for s, _ in runs)
        print(
            f"{label:<11} {seconds:7.3f} s to the next turn's first token  {runs[0][1]:>6,} prompt tokens "
            f"computed  {base / seconds:6.2f}x"
        )
    print(f"host tier: {copies['pages']:,} pages copied back as {copies['slices']:,} slice copies a tensor")


if __name__ == "__main__":
    main()
