"""Embedding vectors after pooling: L2 normalization and Matryoshka truncation (Qwen3-Embedding is trained
so that a vector's first N dimensions, normalized again, are an embedding of their own)."""

from __future__ import annotations

import math

from engine.errors import NinferError
from engine.request import SamplingParams

# a pooled request: the prompt's last hidden state, with one token sampled (and dropped) as any request's
POOLED = SamplingParams(max_tokens=1, temperature=0.0, pooling="last")


def normalized(vector: list[float]) -> list[float]:
    """The vector scaled to length 1 (a zero vector stays zero)."""
    norm = math.sqrt(sum(v * v for v in vector))
    return list(vector) if norm == 0 else [v / norm for v in vector]


def truncated(vector: list[float], dimensions: int | None, normalize: bool) -> list[float]:
    """The first `dimensions` values (all when None), normalized again unless `normalize` is false."""
    if dimensions is not None and not 1 <= dimensions <= len(vector):
        raise NinferError(f"dimensions must be between 1 and {len(vector)} (got {dimensions})")
    head = list(vector[:dimensions]) if dimensions is not None else list(vector)
    return normalized(head) if normalize else head
