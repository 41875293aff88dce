"""What structured outputs cost in decode: tok/s with a grammar vs. without, same model, same run.

Three runs of the same prompt, each exactly N tokens (greedy, the end token biased away; the JSON grammar
asks for an array of at least 1000 strings, so it cannot end early): plain; a grammar that allows every token (the cost of
computing, copying and applying the masks alone); a JSON schema (llguidance's real work). Decode rate
excludes prefill: tg = (N - 1) / (t(N) - t(1)), median over repeats. Prints each rate and its ratio to plain.

    python benchmarks/structured_overhead.py [--tokens 128] [--repeat 3] [--device cpu|cuda] [--spec ngram]
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine import LLM, SamplingParams
from engine.structured import grammars

MESSAGES = [{"role": "user", "content": "List twenty fruits as a JSON array of strings."}]
GRAMMARS = {
    "plain": None,
    "all tokens allowed": grammars.regex(r"(?s:.*)"),
    "JSON schema (array of strings)": grammars.json_schema(
        {"type": "array", "items": {"type": "string"}, "minItems": 1000}
    ),
}


def decode_rate(llm: LLM, grammar: str | None, n: int, repeat: int) -> float:
    def run(tokens: int) -> float:
        params = SamplingParams(
            max_tokens=tokens,
            temperature=0.0,
            grammar=grammar,
            logit_bias={t: -100 for t in llm.eos_token_ids},
        )
        t0 = time.perf_counter()
        out = llm.chat(MESSAGES, params)
        assert len(out.token_ids) == tokens, (len(out.token_ids), out.text)
        return time.perf_counter() - t0

    run(2)  # warm-up (llguidance builds its tokenizer once)
    return statistics.median((n - 1) / (run(n) - run(1)) for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--spec", default="none")
    args = ap.parse_args()
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    llm = LLM(device=args.device, dtype=dtype, spec=args.spec)
    print(
        f"{llm.description}, {args.device}, spec {args.spec}, {args.tokens} tokens, median of {args.repeat}"
    )
    rates = {name: decode_rate(llm, g, args.tokens, args.repeat) for name, g in GRAMMARS.items()}
    for name, rate in rates.items():
        print(f"{name:32s} {rate:8.1f} tok/s  {rate / rates['plain']:.2f}x plain")


if __name__ == "__main__":
    main()
