"""Raced drafts against argmax drafts for sampled requests (spec draft), side by side in one process, on the
embedded default model (or MODEL) as the target: per draft model, sampling setting and workload, the share
of drafts accepted and the tokens a decode step emits, with each request's drafts raced (the drafter's
winner of the race the sampler will run at the draft's position: engine/sample/race.py) and with the
drafter's argmax (the drafts before races, whatever the request's sampling). Seeded, so a run of a
request produces the tokens it produces without drafts, but where the target's logits in a verification step
and in a one-token step differ in the last bits (the embedded model's 4-bit CPU kernels: ~1e-4 in
log-probability) at a draw that close to a tie; `same` counts the runs whose tokens equal the run without
drafts.

Acceptance is a property of the models and the sampling, not of the machine, so the CPU measures it; the
speed-up a GPU sees from it is not measured here.

Drafts: `self` (the target itself: the ceiling, an exact copy), `w8g128` and `w4g128` (the target
converted, rounded to nearest: a close copy, total variation ~0.04 from the target a token, and a loose one,
~0.35-0.5, as a small model of the same family is).
Settings: `qwen` (temperature 0.7, top-k 20, top-p 0.8: Qwen3's non-thinking recommendation), `qwen+pp`
(the same with presence_penalty 1.5, which Qwen suggests against repetitions) and `t1` (temperature 1,
nothing truncated). Workloads: `code` and `prose`.

    python benchmarks/draft_race.py [MODEL] [--draft-tokens 3] [--gen 96] [--seeds 3]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from engine import LLM, SamplingParams
from engine.models.loader import default_model_path
from engine.quant.convert import convert

WORKLOADS = {
    "code": "Write a Python function that parses a CSV file and returns the average of each numeric column.",
    "prose": "Describe a walk through an old city on a rainy evening.",
}
SETTINGS = {
    "qwen": dict(temperature=0.7, top_k=20, top_p=0.8),
    "qwen+pp": dict(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5),
    "t1": dict(temperature=1.0),
}


def _run(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[list[int], int, int, int]:
    """(tokens, decode steps after the first token, drafts verified, drafts accepted)."""
    llm.add_request(prompt, params)
    steps, out = 0, None
    while llm.has_unfinished_requests():
        results = llm.step()
        if out is not None and out.token_ids:
            steps += 1
        if results:
            out = results[-1][0]
    return out.token_ids, steps, out.num_draft_tokens, out.num_accepted_tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--gen", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    model = Path(args.model or default_model_path())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        drafts = {"self": model}
        for recipe in ("w8g128", "w4g128"):
            drafts[recipe] = Path(tmp) / f"{recipe}.ninfer"
            convert(model, drafts[recipe], recipe, method="rtn")
        plain = LLM(str(model))
        print(
            f"# target {model.name}; {args.draft_tokens} drafts a step; {args.gen} tokens; {args.seeds} seeds"
        )
        print(f"# {platform.processor() or platform.machine()}, CPU; acceptance is machine-independent")
        print(
            "| draft | sampling | workload | drafts (raced) | accepted, raced | accepted, argmax "
            "| tokens/step, raced | tokens/step, argmax | same (raced, argmax) |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for name, draft in drafts.items():
            llms = {}
            for raced in (True, False):
                llm = LLM(str(model), spec="draft", draft_model=str(draft), draft_tokens=args.draft_tokens)
                if not raced:
                    llm.runner.drafter.races = None  # the drafter's argmax
                llms[raced] = llm
            for setting, options in SETTINGS.items():
                for workload, text in WORKLOADS.items():
                    prompt = plain.tokenizer.encode_chat([{"role": "user", "content": text}], None, True)
                    # tokens, steps, drafted, accepted, runs with the tokens of the run without drafts
                    totals = {True: [0, 0, 0, 0, 0], False: [0, 0, 0, 0, 0]}
                    for seed in range(args.seeds):
                        params = SamplingParams(max_tokens=args.gen, seed=seed, ignore_eos=True, **options)
                        want = _run(plain, prompt, params)[0]
                        for raced, llm in llms.items():
                            tokens, steps, drafted, accepted = _run(llm, prompt, params)
                            same = int(tokens == want)
                            for i, v in enumerate((len(tokens) - 1, steps, drafted, accepted, same)):
                                totals[raced][i] += v
                    rate = {r: t[3] / max(t[2], 1) for r, t in totals.items()}
                    per_step = {r: t[0] / max(t[1], 1) for r, t in totals.items()}
                    print(
                        f"| {name} | {setting} | {workload} | {totals[True][2]} | {rate[True]:.0%} | "
                        f"{rate[False]:.0%} | {per_step[True]:.2f} | {per_step[False]:.2f} | "
                        f"{totals[True][4]}, {totals[False][4]} of {args.seeds} |"
                    )
    print(f"# {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
