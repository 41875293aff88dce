"""Decode tok/s with a LoRA adapter against the base model, same engine, same run (engine/lora).

A random rank-R adapter on every projection of every decoder layer of the embedded default model (q, k,
v, o, gate, up, down); decode rate as benchmarks/cpu_decode.py measures it (greedy, fixed length, the
1-token run subtracted), for a request without the adapter, one with it, the two side by side (C2), and one
with a weighted mix of two such adapters (llama.cpp's `lora` scales: each delta computed and summed).

    python benchmarks/lora_overhead.py [--rank 16] [--tokens 128] [--repeat 3] [--device cpu]
"""

from __future__ import annotations

import argparse

import torch
from cpu_decode import MESSAGES, decode_rate

from engine import LLM, SamplingParams
from engine.layers.linear import Linear, MergedLinear
from engine.lora.peft import LoraPair


def adapter_pairs(model, rank: int, seed: int = 0) -> list[LoraPair]:
    """Random pairs on every linear layer of the decoder (each shard of a fused one)."""
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for name, module in model.named_modules():
        if not (isinstance(module, Linear) and name.startswith("model.layers.")):
            continue
        shards = module.offsets.values() if isinstance(module, MergedLinear) else [(0, module.out_features)]
        for start, size in shards:
            a = torch.randn(rank, module.in_features, generator=gen) / module.in_features**0.5
            b = torch.randn(size, rank, generator=gen) * 0.01
            pairs.append(LoraPair(name, (start, size), a, b))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    llm = LLM(device=args.device, max_concurrency=2)
    llm.adapters.add("r", "(in memory)", adapter_pairs(llm.model, args.rank))
    llm.adapters.add("s", "(in memory)", adapter_pairs(llm.model, args.rank, seed=1))
    ids = llm.tokenizer.encode_chat(MESSAGES)

    def run(adapters):
        def go(n: int) -> None:
            params = [
                SamplingParams(
                    max_tokens=n,
                    temperature=0.0,
                    ignore_eos=True,
                    **({"adapter_scales": a} if isinstance(a, dict) else {"adapter": a}),
                )
                for a in adapters
            ]
            outs = llm.generate(prompt_token_ids=[ids] * len(adapters), sampling_params=params)
            assert all(len(o.token_ids) == n for o in outs)

        return go

    base = {1: decode_rate(run([None]), args.tokens, args.repeat)}
    base[2] = decode_rate(run([None, None]), args.tokens, args.repeat)
    print(
        f"embedded model, {args.device}, adapter rank {args.rank} on every projection, {llm.adapters.num_bytes / 2**21:.1f} MiB each"
    )
    print("| requests | decode tok/s (each) | vs the base model at the same concurrency |")
    print("| --- | --- | --- |")
    print(f"| base (C1) | {base[1]:.1f} | 1.00 |")
    print(f"| base x 2 (C2) | {base[2]:.1f} | 1.00 |")
    mix = {"r": 0.5, "s": 0.5}
    rows = (
        ("adapter (C1)", ["r"]),
        ("mix of two adapters (C1)", [mix]),
        ("base + adapter (C2)", [None, "r"]),
        ("adapter x 2 (C2)", ["r", "r"]),
    )
    for label, adapters in rows:
        rate = decode_rate(run(adapters), args.tokens, args.repeat)
        print(f"| {label} | {rate:.1f} | {rate / base[len(adapters)]:.2f} |")


if __name__ == "__main__":
    main()
