"""What a first DRY request waits for before it is queued: the vocabulary's bytes read and its sequence
breakers found in them (engine/token_bytes.py vocab_bytes, engine/sample/dry.py breaker_mask), against the
token-by-token way (each token's bytes read by the reader, each breaker looked for in each token), same
process, side by side, on the embedded model's tokenizer (49,152 tokens; the time grows with the vocabulary:
Qwen3's is 5 times as large). Median of the repeats; both ways are checked to agree.

    python benchmarks/dry_breakers.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from engine.models.loader import open_source
from engine.sample.dry import breaker_mask
from engine.token_bytes import token_byte_reader, vocab_bytes

BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's defaults


def token_by_token(backend, size: int) -> np.ndarray:
    read = token_byte_reader(backend)
    tokens = [read(i) for i in range(size)]
    mask = np.zeros(size, dtype=bool)
    for needle in {b.encode() for b in BREAKERS}:
        mask[[i for i, token in enumerate(tokens) if needle in token]] = True
    return mask


def at_once(backend, size: int) -> np.ndarray:
    return breaker_mask(vocab_bytes(backend, size), size, BREAKERS)


def timed(fn, *args) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tok = open_source(None).tokenizer
    backend, size = tok.backend, tok.vocab_size
    slow, fast = [], []
    for _ in range(args.repeat):
        s, want = timed(token_by_token, backend, size)
        f, got = timed(at_once, backend, size)
        assert (want == got).all(), "the two ways disagree"
        slow.append(s)
        fast.append(f)
    s, f = statistics.median(slow), statistics.median(fast)
    print(f"{size} tokens, breakers {BREAKERS!r}, median of {args.repeat}")
    print(f"token by token {s * 1000:.0f} ms   at once {f * 1000:.0f} ms   ratio {s / f:.1f}x")


if __name__ == "__main__":
    main()
