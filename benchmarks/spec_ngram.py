"""N-gram speculative decoding against plain decoding, side by side in one process, on the embedded default
model (or MODEL): per workload, decode tokens/s of each, their ratio, draft acceptance and tokens per step;
and, where the workload has an expected reply, n-gram decoding with that reply sent as the prediction
(OpenAI's Predicted Outputs); and with the reply itself as the prediction (the ceiling: every predicted
draft right). Greedy, so every run must produce the same tokens (checked).

Workloads: `copy` (repeat a file; predicted: the file), `edit` (the file back with one change: the
coding-agent case; predicted: the file with the change made), `prose` (an open question: little to copy,
nothing to predict). The timing window starts at the first token, so prefill is out of it.

    python benchmarks/spec_ngram.py [MODEL] [--draft-tokens 4] [--prediction-tokens N] [--gen 160] [--repeat 3]
        [--device cpu|cuda]

`--prediction-tokens`: how far a prediction drafts a step (the engine's default: 16).
"""

from __future__ import annotations

import argparse
import inspect
import platform
import statistics
import time

import torch

from engine import LLM, SamplingParams
from engine.sample import penalties

SOURCE = inspect.getsource(penalties.apply_penalties)  # (engine/sample/sampler.py's until 2026-12-03)
WORKLOADS = {  # name: (prompt, the reply expected, or None)
    "copy": (f"Repeat this code exactly, with nothing else:\n\n{SOURCE}", SOURCE),
    "edit": (
        f"Rename the argument `params` to `sampling` in this code and print the whole function:\n\n{SOURCE}",
        SOURCE.replace("params", "sampling"),
    ),
    "prose": ("Explain in a few paragraphs why the sky is blue.", None),
}


def _decode(
    llm: LLM, prompt: str, gen: int, prediction: str | list[int] | None = None
) -> tuple[list[int], float, int]:
    """(tokens, decode seconds after the first token, engine steps after the first token); `prediction`:
    text, or token ids."""
    predicted = prediction or ()
    if isinstance(prediction, str):
        predicted = llm.tokenizer.encode(prediction, add_special_tokens=False)
    params = SamplingParams(max_tokens=gen, temperature=0.0, prediction=predicted)
    ids = llm.tokenizer.encode_chat([{"role": "user", "content": prompt}], None, True)
    llm.add_request(ids, params)
    first, steps, out = None, 0, None
    while llm.has_unfinished_requests():
        results = llm.step()
        if results:
            out = results[-1][0]
        if first is None and out is not None and out.token_ids:
            first = time.perf_counter()
        elif first is not None:
            steps += 1
    return out, time.perf_counter() - first, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--prediction-tokens", type=int, default=None)
    ap.add_argument("--gen", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    common = dict(max_concurrency=1, device=args.device, dtype=dtype, enable_prefix_caching=False)
    plain = LLM(args.model, **common)
    spec = LLM(
        args.model,
        spec="ngram",
        draft_tokens=args.draft_tokens,
        prediction_tokens=args.prediction_tokens,
        **common,
    )
    print(
        f"# {plain.description}; {args.device} {dtype} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads); draft tokens {args.draft_tokens}, prediction tokens "
        f"{spec.engine_config.num_prediction_tokens}; median of {args.repeat}"
    )
    print(
        "| workload | tokens | plain tok/s | ngram tok/s | ratio | accepted | tokens/step "
        "| + prediction tok/s | ratio | accepted | tokens/step | + the reply as prediction tok/s | ratio "
        "| accepted | tokens/step |"
    )
    print("| --- " + "| ---: " * 14 + "|")
    for name, (prompt, expected) in WORKLOADS.items():
        rates: dict[str, list[float]] = {"plain": [], "ngram": [], "predicted": [], "exact": []}
        outs, steps = {}, {}
        for _ in range(args.repeat):  # alternate, so drift in machine speed hits all alike
            ref, t_plain, _ = _decode(plain, prompt, args.gen)
            rates["plain"].append((len(ref.token_ids) - 1) / t_plain)
            for kind, prediction in (("ngram", None), ("predicted", expected), ("exact", ref.token_ids)):
                if kind == "predicted" and expected is None:
                    continue
                out, seconds, steps[kind] = _decode(spec, prompt, args.gen, prediction)
                assert out.token_ids == ref.token_ids, f"{name}: {kind} decoding changed the output"
                rates[kind].append((len(out.token_ids) - 1) / seconds)
                outs[kind] = out
        n, p = len(ref.token_ids) - 1, statistics.median(rates["plain"])
        row = f"| {name} | {n + 1} | {p:.1f} |"
        for kind in ("ngram", "predicted", "exact"):
            if kind not in outs:
                row += " – | – | – | – |"
                continue
            out, s = outs[kind], statistics.median(rates[kind])
            accepted = out.num_accepted_tokens / out.num_draft_tokens if out.num_draft_tokens else 0.0
            row += f" {s:.1f} | {s / p:.2f}x | {accepted:.0%} | {n / max(steps[kind], 1):.2f} |"
        print(row)


if __name__ == "__main__":
    main()
