"""What `--cache-reuse` saves an editor's completion whose window slid: the time to the first token of the
next request, and the prompt tokens computed, with the flag against without it, same process, side by
side (embedded default model).

Each run builds what llama.vim sends: extra context (chunks of other files) then a window of the file
around the cursor. Request A, then B with the cursor `--lines` lines further down: B's window drops A's
first lines and adds as many at its end. Without the flag B's prefix cache hit ends at the first dropped
token and the rest of the window is computed again; with it, the window's kept lines come from A's pages
at shifted positions. Median of the repeats; prints the times and their ratio.

    python benchmarks/cache_reuse.py [--window-lines 160] [--lines 8] [--repeat 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine import LLM, SamplingParams

GEN = 4
MIN_RUN = 256  # what llama.vim's README asks llama-server for


def source_lines(n: int) -> list[str]:
    """A made-up Python file of `n` lines (distinct, so the prefix cache cannot match lines by accident)."""
    return [
        f"    total_{i} = compute(values[{i}], scale={i % 7}) + offset_{i % 13}  # step {i}\n"
        for i in range(n)
    ]


def prompt(llm: LLM, extra: str, lines: list[str], first: int, count: int) -> list[int]:
    return llm.tokenizer.encode(extra + "".join(lines[first : first + count]))


def first_token(llm: LLM, ids: list[int]) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens computed) of one request."""
    t0 = time.perf_counter()
    rid = llm.add_request(ids, SamplingParams(max_tokens=1, temperature=0.0))
    while True:
        done = [o for o, _ in llm.step() if o.request_id == rid and o.finished]
        if done:
            return time.perf_counter() - t0, len(ids) - done[0].num_cached_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window-lines", type=int, default=160)
    ap.add_argument("--lines", type=int, default=8, help="lines the cursor moves down between the requests")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    engines = {
        "without": LLM(device=args.device, max_context=8192),
        "with": LLM(device=args.device, max_context=8192, cache_reuse=MIN_RUN),
    }
    lines = source_lines(args.window_lines + args.lines * (args.repeat + 1))
    extra = "# utils.py\ndef compute(v, scale):\n    return v * scale\n" * 20
    times: dict[str, list[float]] = {name: [] for name in engines}
    computed: dict[str, list[int]] = {name: [] for name in engines}
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True)
    for r in range(args.repeat):
        for name, llm in engines.items():  # side by side, round by round
            llm.reset_prefix_cache()
            a = prompt(llm, extra, lines, r * args.lines, args.window_lines)
            llm.generate(prompt_token_ids=a, sampling_params=params)
            b = prompt(llm, extra, lines, (r + 1) * args.lines, args.window_lines)
            seconds, n = first_token(llm, b)
            times[name].append(seconds)
            computed[name].append(n)
    print(
        f"prompt {len(b)} tokens; window {args.window_lines} lines, moved {args.lines}; median of {args.repeat}"
    )
    for name in engines:
        t = statistics.median(times[name])
        print(
            f"{name:>8} --cache-reuse: first token {t * 1000:.0f} ms, {statistics.median(computed[name])} tokens computed"
        )
    ratio = statistics.median(times["without"]) / statistics.median(times["with"])
    print(f"time to first token: {ratio:.1f}x faster with --cache-reuse {MIN_RUN}")


if __name__ == "__main__":
    main()
