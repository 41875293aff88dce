"""Counter-based Exp(1) noise for the exponential race (the math: kernels/race_noise/naive.py): one program
a row and a block of token ids, the hash in uint32 arithmetic."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fmix(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def _race_noise_kernel(keys_ptr, out_ptr, stride_o, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + row)
    lo = (key & 0xFFFFFFFF).to(tl.uint32)
    hi = ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)
    h = _fmix(_fmix(cols.to(tl.uint32) * 0x9E3779B9 ^ lo) ^ hi)
    u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    tl.store(out_ptr + row * stride_o + cols, -tl.log(u), mask=cols < vocab)


def race_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """keys [R] int64 -> [R, vocab] fp32."""
    assert keys.dim() == 1 and keys.dtype == torch.int64
    out = torch.empty((keys.shape[0], vocab), dtype=torch.float32, device=keys.device)
    if keys.shape[0] == 0:
        return out
    block = min(1024, triton.next_power_of_2(vocab))
    _race_noise_kernel[(keys.shape[0], triton.cdiv(vocab, block))](
        keys.contiguous(), out, out.stride(0), vocab, BLOCK=block
    )
    return out
