"""The host time a decode step spends staging its block table: built again from every request's page list
each step (as the decode graphs, the drafter's chain and the eager passes did) against BlockTables
(engine/worker/block_table.py: each row gets only its new pages), side by side in one process.

A decode step with the MTP drafter stages a table three times (the decode graph, the head's first pass, its
chain), each time for every running request: at 180K tokens a request has 11,520 pages of 16 tokens. Each
row: context, concurrency, microseconds a staging takes each way (mean over --steps decode steps of 4
tokens a request, a new page every 4 steps), their ratio. Both run on the CPU here (the table in host
memory); on a GPU each adds one host-to-device copy of the step's rows.

    python benchmarks/block_table_staging.py [--contexts 8k,32k,128k,180k,256k] [--concurrency 1,2,4]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from engine.sizes import parse_size
from engine.worker.block_table import BlockTables

BLOCK_SIZE = 16
TOKENS_A_STEP = 4  # the last token and 3 accepted drafts


def rebuilt(buffer: torch.Tensor, rows: list[list[int]]) -> None:
    """The table built again, as each step did: zeros, then each row's pages as a tensor."""
    table = torch.zeros(len(rows), buffer.shape[1], dtype=torch.int32)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    buffer[: len(rows)].copy_(table)


def timed(stage, context: int, concurrency: int, steps: int) -> float:
    """Mean seconds a staging takes over `steps` decode steps of requests `context` tokens deep."""
    rng = random.Random(0)
    rows = [[rng.randrange(1 << 20) for _ in range(context // BLOCK_SIZE)] for _ in range(concurrency)]
    tokens = [context] * concurrency
    total = 0.0
    for _ in range(steps):
        for i in range(concurrency):
            tokens[i] += TOKENS_A_STEP
            if tokens[i] > len(rows[i]) * BLOCK_SIZE:
                rows[i].append(rng.randrange(1 << 20))
        start = time.perf_counter()
        stage(rows)
        total += time.perf_counter() - start
    return total / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="8k,32k,128k,180k,256k")
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print("| context | concurrency | rebuilt each step, us | BlockTables, us | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for context in (parse_size(c, "--contexts") for c in args.contexts.split(",")):
        for c in (int(n) for n in args.concurrency.split(",")):
            width = (context + args.steps * TOKENS_A_STEP) // BLOCK_SIZE + 1
            buffer = torch.zeros(c, width, dtype=torch.int32)
            old = timed(lambda rows, buffer=buffer: rebuilt(buffer, rows), context, c, args.steps)
            tables = BlockTables(torch.device("cpu"), c, width, grows=False)
            new = timed(tables.stage, context, c, args.steps)
            print(f"| {context:,} | {c} | {old * 1e6:,.0f} | {new * 1e6:,.1f} | {old / new:,.0f}x |")


if __name__ == "__main__":
    main()
