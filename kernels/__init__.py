"""Public ops of ninfer. Each op has a naive torch twin (fp32 reference) under kernels/<op>/naive.py and,
where written, a Triton kernel under kernels/<op>/triton.py with the same signature.

Dispatch: Triton on CUDA tensors; on the CPU the op's C twin (kernels/<op>/native.c, built once by
kernels/native_build.py) where it is built and takes the arguments (fp32, the layouts the model passes),
else the naive twin. NINFER_KERNELS=naive|triton forces one (triton on CPU tensors needs
TRITON_INTERPRET=1, which the tests use); NINFER_CPU_KERNELS=torch keeps the CPU on the naive twins.
NINFER_KERNELS is read once, at import (every op asks, and an environment lookup per op cost ~0.2 ms a
decode step); `force_backend` switches later. Triton modules are imported on
first use, so a CPU-only run never imports Triton.

The folder installs as `ninfer_kernels` (pyproject's package-dir): `kernels` is the import name of a
Hugging Face library that transformers requires, and the two must live in one environment.
"""

from __future__ import annotations

import importlib
import os

import torch

from ninfer_kernels import native_build
from ninfer_kernels.conv1d import naive as _conv1d_naive
from ninfer_kernels.conv1d import native as _conv1d_native
from ninfer_kernels.fp4_matmul import naive as _fp4_matmul_naive
from ninfer_kernels.fused_moe import naive as _fused_moe_naive
from ninfer_kernels.gated_delta import naive as _gated_delta_naive
from ninfer_kernels.gated_delta import native as _gated_delta_native
from ninfer_kernels.int8_act import naive as _int8_act_naive
from ninfer_kernels.int8_matmul import naive as _int8_matmul_naive
from ninfer_kernels.kv_store import naive as _kv_store_naive
from ninfer_kernels.kv_store import native as _kv_store_native
from ninfer_kernels.paged_attention import naive as _paged_attention_naive
from ninfer_kernels.paged_attention import native as _paged_attention_native
from ninfer_kernels.quant_embedding import naive as _quant_embedding_naive
from ninfer_kernels.quant_matmul import naive as _quant_matmul_naive
from ninfer_kernels.race_noise import naive as _race_noise_naive
from ninfer_kernels.race_noise import native as _race_noise_native
from ninfer_kernels.rmsnorm import naive as _rmsnorm_naive
from ninfer_kernels.rmsnorm import native as _rmsnorm_native
from ninfer_kernels.rope import naive as _rope_naive
from ninfer_kernels.rope import native as _rope_native
from ninfer_kernels.silu_mul import naive as _silu_mul_naive
from ninfer_kernels.silu_mul import native as _silu_mul_native

__all__ = [
    "causal_conv1d",
    "fp4_matmul",
    "fused_moe",
    "gated_delta_rule",
    "int8_matmul",
    "kv_store",
    "moe_route",
    "paged_attention",
    "quant_embedding",
    "quant_matmul",
    "quantize_act",
    "race_noise",
    "rmsnorm",
    "rmsnorm_gated",
    "rope",
    "silu_mul",
    "force_backend",
    "use_triton",
]

BACKENDS = ("", "naive", "triton")  # "": by device
_forced = os.environ.get("NINFER_KERNELS", "")


def force_backend(name: str) -> None:
    """Run every op through `name` ("naive" or "triton") from now on; "" dispatches by device again."""
    global _forced
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend '{name}'; use naive, triton, or '' (by device)")
    _forced = name


def use_triton(x: torch.Tensor) -> bool:
    """Whether an op on `x` runs its Triton kernel (see the module docstring)."""
    if _forced == "naive":
        return False
    return _forced == "triton" or x.is_cuda


def use_native(x: torch.Tensor) -> bool:
    """Whether an op on `x` tries its C twin first (a CPU tensor, the library built, no backend forced)."""
    return _forced == "" and x.is_cpu and native_build.library() is not None


def _native_or_naive(native_op, naive_op, *args):
    """The C twin where it is built and takes the arguments (it returns None where not), else the naive twin."""
    out = native_op(*args) if use_native(args[0]) else None
    return naive_op(*args) if out is None else out


def _triton(op: str):
    return importlib.import_module(f"ninfer_kernels.{op}.triton")


def rmsnorm(x, weight, eps, residual=None, zero_centered=False):
    if use_triton(x):
        return _triton("rmsnorm").rmsnorm(x, weight, eps, residual, zero_centered)
    args = (x, weight, eps, residual, zero_centered)
    return _native_or_naive(_rmsnorm_native.rmsnorm, _rmsnorm_naive.rmsnorm, *args)


def rmsnorm_gated(x, gate, weight, eps):
    if use_triton(x):
        return _triton("rmsnorm").rmsnorm_gated(x, gate, weight, eps)
    args = (x, gate, weight, eps)
    return _native_or_naive(_rmsnorm_native.rmsnorm_gated, _rmsnorm_naive.rmsnorm_gated, *args)


def rope(q, k, positions, cos_sin_cache):
    if use_triton(q):
        return _triton("rope").rope(q, k, positions, cos_sin_cache)
    return _native_or_naive(_rope_native.rope, _rope_naive.rope, q, k, positions, cos_sin_cache)


def silu_mul(x):
    if use_triton(x):
        return _triton("silu_mul").silu_mul(x)
    return _native_or_naive(_silu_mul_native.silu_mul, _silu_mul_naive.silu_mul, x)


def causal_conv1d(x, weight, conv_state, cu_seqlens, state_indices, apply_silu=True):
    args = (x, weight, conv_state, cu_seqlens, state_indices, apply_silu)
    if use_triton(x):
        return _triton("conv1d").causal_conv1d(*args)
    return _native_or_naive(_conv1d_native.causal_conv1d, _conv1d_naive.causal_conv1d, *args)


def gated_delta_rule(q, k, v, g, beta, state, cu_seqlens, state_indices, use_qk_l2norm=True):
    args = (q, k, v, g, beta, state, cu_seqlens, state_indices, use_qk_l2norm)
    if use_triton(q):
        return _triton("gated_delta").gated_delta_rule(*args)
    return _native_or_naive(_gated_delta_native.gated_delta_rule, _gated_delta_naive.gated_delta_rule, *args)


def kv_store(k, v, cache, slot_mapping):
    if use_triton(k):
        return _triton("kv_store").kv_store(k, v, cache, slot_mapping)
    if use_native(k) and _kv_store_native.kv_store(k, v, cache, slot_mapping):
        return None
    return _kv_store_naive.kv_store(k, v, cache, slot_mapping)


def paged_attention(
    q, cache, block_table, seq_lens, cu_seqlens_q, scale, query_tokens_per_seq=0, int8_queries=False
):
    """query_tokens_per_seq: every sequence's query count when equal (a host int; 0 = not known), so the
    Triton path can verify draft tokens in its split-K decode kernel; the CPU twins read cu_seqlens_q.
    int8_queries (--int8-prefill): over an int8 / k8v4 cache the prefill kernel multiplies int8 queries."""
    if use_triton(q):
        return _triton("paged_attention").paged_attention(
            q,
            cache,
            block_table,
            seq_lens,
            cu_seqlens_q,
            scale,
            query_tokens_per_seq=query_tokens_per_seq,
            int8_queries=int8_queries,
        )
    args = (q, cache, block_table, seq_lens, cu_seqlens_q, scale)
    if int8_queries:  # the naive twin alone rounds the queries as the kernel does
        return _paged_attention_naive.paged_attention(*args, int8_queries=True)
    return _native_or_naive(
        _paged_attention_native.paged_attention, _paged_attention_naive.paged_attention, *args
    )


def quant_matmul(x, packed, scales, minimums, bits, group_size, out=None, columns=None):
    impl = _triton("quant_matmul") if use_triton(x) else _quant_matmul_naive
    return impl.quant_matmul(x, packed, scales, minimums, bits, group_size, out, columns=columns)


def fp4_matmul(x, packed, scale_codes, multiplier, group_size, e8m0, out=None):
    impl = _triton("fp4_matmul") if use_triton(x) else _fp4_matmul_naive
    return impl.fp4_matmul(x, packed, scale_codes, multiplier, group_size, e8m0, out)


def quant_embedding(ids, packed, scales, minimums, bits, group_size, dim, dtype):
    impl = _triton("quant_embedding") if use_triton(packed) else _quant_embedding_naive
    return impl.quant_embedding(ids, packed, scales, minimums, bits, group_size, dim, dtype)


def quantize_act(x, group_size):
    impl = _triton("int8_act") if use_triton(x) else _int8_act_naive
    return impl.quantize_act(x, group_size)


def int8_matmul(codes, x_scales, x_sums, packed, scales, minimums, bits, group_size, out):
    impl = _triton("int8_matmul") if use_triton(codes) else _int8_matmul_naive
    return impl.int8_matmul(codes, x_scales, x_sums, packed, scales, minimums, bits, group_size, out)


def moe_route(router_logits, top_k, renormalize):
    return _fused_moe_naive.moe_route(router_logits, top_k, renormalize)


def fused_moe(x, gate_up, down, topk_weights, topk_ids):
    impl = _triton("fused_moe") if use_triton(x) else _fused_moe_naive
    return impl.fused_moe(x, gate_up, down, topk_weights, topk_ids)


def race_noise(keys, vocab):
    # keys [R] int64 -> [R, vocab] fp32 Exp(1) noise of token ids 0 .. vocab - 1 (kernels/race_noise/naive.py)
    if use_triton(keys):
        return _triton("race_noise").race_noise(keys, vocab)
    return _native_or_naive(_race_noise_native.race_noise, _race_noise_naive.race_noise, keys, vocab)
