"""Counter-based noise for the exponential race (engine/sample/sampler.py): token `v` of a row keyed `key`
gets E = -log(U), U uniform in (0, 1) from a hash of (key, v) alone, so the noise of any token at any position
is known without drawing the ones before it. The sampler and the drafters (engine/spec/race.py) draw the same
noise from the same key; the Triton kernel is bit-exact to this twin in the uniforms.

The hash is in unsigned 32-bit arithmetic: h = fmix(fmix(v * GOLDEN ^ lo) ^ hi), lo and hi the key's halves,
fmix MurmurHash3's finalizer; U = (top 23 bits of h + 0.5) / 2^23: exact in fp32 and never 1 (24 bits would
round the largest to 1, a noise of 0)."""

from __future__ import annotations

import torch

GOLDEN = 0x9E3779B9
MIX1 = 0x85EBCA6B
MIX2 = 0xC2B2AE35
MASK32 = 0xFFFFFFFF
U23 = 1.0 / (1 << 23)  # U = (the hash's top 23 bits + 0.5) / 2^23: exact in fp32, below 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) as int64, without a product past 2^63."""
    high = ((x >> 16) * c) & 0xFFFF
    return ((high << 16) + (x & 0xFFFF) * c) & MASK32


def _fmix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, MIX1)
    x = x ^ (x >> 13)
    x = _mul32(x, MIX2)
    return x ^ (x >> 16)


def race_hash(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """keys [R] int64 -> [R, vocab] int64: the 32-bit hash of each (key, token id)."""
    lo = (keys & MASK32).unsqueeze(1)  # [R, 1]
    hi = ((keys >> 32) & MASK32).unsqueeze(1)
    v = torch.arange(vocab, dtype=torch.int64, device=keys.device).unsqueeze(0)  # [1, V]
    return _fmix(_fmix(_mul32(v, GOLDEN) ^ lo) ^ hi)


def race_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """keys [R] int64 -> [R, vocab] fp32: Exp(1) noise, E = -log(U), for token ids 0 .. vocab - 1."""
    u = ((race_hash(keys, vocab) >> 9).to(torch.float32) + 0.5) * U23
    return -torch.log(u)


def _fmix_int(x: int) -> int:
    x ^= x >> 16
    x = (x * MIX1) & MASK32
    x ^= x >> 13
    x = (x * MIX2) & MASK32
    return x ^ (x >> 16)


def race_uniform(key: int, index: int) -> float:
    """The uniform in (0, 1) that the noise of token `index` of a row keyed `key` comes from, on the host
    (the sampler's XTC coin takes an index past the vocabulary)."""
    key %= 1 << 64
    h = _fmix_int(_fmix_int(((index * GOLDEN) & MASK32) ^ (key & MASK32)) ^ (key >> 32))
    return ((h >> 9) + 0.5) * U23
