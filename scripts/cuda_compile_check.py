"""Compile every Triton kernel for NVIDIA GPUs ahead of time, on a machine without one.

Each case calls an op's Triton wrapper (kernels/<op>/triton.py) on CPU tensors shaped as the models pass
them; every kernel launch becomes a compile-only warmup for the chosen compute capability, through
Triton's own pipeline down to a cubin (its bundled ptxas; no driver, no GPU). This catches what the
interpreter cannot: errors of the compiled path (types, layouts, tl.dot shapes and operand dtypes a target
lacks) and shared memory past the device's per-block limit; ptxas then reports registers and spills per
kernel, the tensor-core generation of its tl.dot (mma v2 = mma.sync; v3 = Hopper's wgmma, which needs 64
rows a warp group), and the count of compiled variants per kernel shows where a runtime value recompiles a
kernel.

    python scripts/cuda_compile_check.py                 # SM 8.6 (RTX 3090) and SM 9.0 (H100 / H200)
    python scripts/cuda_compile_check.py --arch 89 -k attention --json out.json
    python scripts/cuda_compile_check.py --arch 90 --sass -k decode
    python scripts/cuda_compile_check.py --arch 90 --sass _decode_kernel,_quant_matmul_kernel

--sass disassembles each kernel (Triton's bundled nvdisasm; or only those it names, comma-separated) and
counts the instructions of its hottest loop.
Cases that stream memory say how many bytes one program reads per loop iteration (a decode step's KV
tile, a GEMV's weight tile), which turns the count into instructions per KB. An SM issues at most four
warp-instructions a clock, so that count caps the fraction of HBM bandwidth it can consume however well
the memory system does; reported as `issue cap`, for one reference GPU per capability (REFERENCE_GPU).
It also reports how many async copy groups (cp.async) the loop keeps in flight while a step computes
(`in flight`): 0 means every step waits for all its copies, so a program has one tile in flight at a time
and HBM latency is exposed once a step.

Exit status 1 when a case fails to compile or a kernel needs more shared memory than its target has.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not interpreted ones (read at decoration)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from engine.cache.kv_layout import KVCache  # noqa: E402
from ninfer_kernels.paged_attention import MAX_VERIFY_ROWS  # noqa: E402
from ninfer_kernels.triton_config import SHARED_MEMORY_PER_BLOCK as SHARED_LIMIT  # noqa: E402

DEVICES = {80: "A100", 86: "RTX 3090 / A6000", 89: "RTX 4090 / L40", 90: "H100 / H200", 120: "RTX 5090"}
# one GPU per capability for --sass's issue cap: (name, HBM bytes/s, SMs, boost clock Hz), vendor figures
REFERENCE_GPU = {
    80: ("A100 SXM", 2.039e12, 108, 1.41e9),
    86: ("RTX 3090", 0.936e12, 82, 1.695e9),
    89: ("RTX 4090", 1.008e12, 128, 2.52e9),
    90: ("H200", 4.8e12, 132, 1.98e9),
    120: ("RTX 5090", 1.792e12, 170, 2.41e9),
}
ISSUE_PER_CLOCK = 4  # warp-instructions an SM issues a clock (four schedulers, one each)
FP8_MIN_ARCH = 89  # fp8 KV is refused below SM 8.9 (engine/cache/kv_layout.py)


class _CompileOnlyDriver:
    """What Triton's JIT asks the active driver for, answered for a target with no device behind it. The
    current device is the capability itself, so each target keeps its own kernel cache."""

    def __init__(self, arch: int):
        self.arch = arch

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)

    def get_current_device(self):
        return self.arch

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


@dataclass
class Compiled:
    kernel: str
    shared: int
    num_warps: int
    num_stages: int
    hash: str  # the compiled variant
    mma: int | None = None  # tensor-core instruction generation of its tl.dot: 2 mma.sync, 3 wgmma (Hopper)
    registers: int | None = None
    spill_bytes: int | None = None
    loop_instructions: int | None = None  # per warp, in the hottest loop (--sass)
    loop_bytes: int | None = None  # what one program streams from memory per iteration of that loop
    instructions_per_kb: float | None = None
    issue_cap: float | None = None  # fraction of HBM bandwidth an SM can issue for at that count
    # async copy groups (cp.async) a step of that loop leaves in flight while it computes: the least count
    # its waits (DEPBAR.LE SB0, n) allow; 0 = every step waits for all its copies, None = no async copies
    copies_in_flight: int | None = None


@dataclass
class Result:
    case: str
    arch: int
    ok: bool
    seconds: float
    error: str = ""
    kernels: list[Compiled] = field(default_factory=list)


_launched: list = []  # (kernel name, CompiledKernel) of the case being compiled
# ptxas -v's report per compiled variant (hash), kept from Triton's own ptxas run where it compiled one here
_ptxas_logs: dict[str, str] = {}


def _compile_only_run(self, *args, grid, warmup, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()) as log:  # Triton prints its ptxas log (dump_ptxas_log)
        kernel = _JIT_RUN(self, *args, grid=grid, warmup=True, **kwargs)
    if "Used " in log.getvalue():
        _ptxas_logs.setdefault(kernel.metadata.hash, log.getvalue())
    _launched.append((self.fn.__name__, kernel))
    return kernel


_JIT_RUN = JITFunction.run


# ---------------------------------------------------------------------------------------------- the cases


def _randn(*shape, dtype=torch.bfloat16):
    """A tensor of the shape and dtype an op takes; uninitialised: a launch that only compiles reads no
    values (a dense MoE case's experts are 400M elements)."""
    return torch.empty(*shape, dtype=dtype)


def _op(name: str):
    return importlib.import_module(f"ninfer_kernels.{name}.triton")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KV_DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8", "k8v4")
# (head_dim, q heads, kv heads) as the supported models have them: SmolLM2-135M, Qwen3-8B, Qwen3.5's
# full-attention layers, a GQA-1 model
ATTN_MODELS = {"smollm2": (64, 9, 3), "qwen3": (128, 32, 8), "qwen3.5": (256, 24, 4), "mha": (128, 16, 16)}


def case_rmsnorm(dtype: str, dim: int, variant: str):
    x = _randn(5, dim, dtype=DTYPES[dtype])
    residual = _randn(5, dim, dtype=DTYPES[dtype]) if variant != "plain" else None
    _op("rmsnorm").rmsnorm(x, _randn(dim, dtype=DTYPES[dtype]), 1e-6, residual, variant == "zero_centered")


def case_rmsnorm_gated(dtype: str, dim: int):
    x, gate = _randn(5, 8, dim, dtype=DTYPES[dtype]), _randn(5, 8, dim, dtype=DTYPES[dtype])
    _op("rmsnorm").rmsnorm_gated(x, gate, _randn(dim, dtype=DTYPES[dtype]), 1e-6)


def case_rope(dtype: str, model: str, rotary_dim: int):
    head_dim, hq, hk = ATTN_MODELS[model]
    qkv = _randn(7, (hq + 2 * hk) * head_dim, dtype=DTYPES[dtype])
    q = qkv[:, : hq * head_dim].view(7, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(7, hk, head_dim)
    positions = torch.arange(7)
    _op("rope").rope(q, k, positions, torch.randn(4096, rotary_dim))


def case_silu_mul(dtype: str, inter: int):
    _op("silu_mul").silu_mul(_randn(5, 2 * inter, dtype=DTYPES[dtype]))


def case_kv_store(kv_dtype: str, model: str, dtype: str):
    head_dim, _, hk = ATTN_MODELS[model]
    cache = KVCache.allocate(kv_dtype, 4, 16, hk, head_dim, "cpu")
    kv = _randn(9, 2 * hk * head_dim, dtype=DTYPES[dtype])
    k, v = kv[:, : hk * head_dim].view(9, hk, head_dim), kv[:, hk * head_dim :].view(9, hk, head_dim)
    _op("kv_store").kv_store(k, v, cache, torch.arange(9))


def case_attention(
    step: str, kv_dtype: str, model: str, dtype: str, context: int = 4096, block_size: int = 16
):
    """step: prefill (a 100-token chunk after a prefix), prefill_long (two 1024-token chunks: the step size
    from which SM 9.0 takes 128-row tiles where they fit), prefill_int8q (the same with --int8-prefill's int8
    queries: integer QK products over an int8 / k8v4 cache), decode (one token per sequence), verify (4
    query tokens per sequence: speculative verification), verify_max (as many query tokens as the dispatch
    sends to the decode kernel: MAX_VERIFY_ROWS rows of queries x GQA group)."""
    head_dim, hq, hk = ATTN_MODELS[model]
    cache = KVCache.allocate(kv_dtype, 8, block_size, hk, head_dim, "cpu")
    num_seqs = 2
    block_table = torch.zeros(num_seqs, context // block_size, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), context - 7, dtype=torch.int32)
    attention = _op("paged_attention")
    if step.startswith("prefill"):
        half = 1024 if step == "prefill_long" else 100  # long: a step wide enough for SM 9.0's wide tile
        q = _randn(2 * half, hq, head_dim, dtype=DTYPES[dtype])
        cu_seqlens = torch.tensor([0, half, 2 * half], dtype=torch.int32)
        int8q = step == "prefill_int8q"
        attention.paged_attention(
            q, cache, block_table, seq_lens, cu_seqlens, head_dim**-0.5, int8_queries=int8q
        )
    else:
        q_per_seq = {"decode": 1, "verify": 4, "verify_max": MAX_VERIFY_ROWS // (hq // hk)}[step]
        q = _randn(num_seqs * q_per_seq, hq, head_dim, dtype=DTYPES[dtype])
        attention.paged_attention_decode(q, cache, block_table, seq_lens, head_dim**-0.5, q_per_seq)
        per_key = cache.num_bytes // (cache.k_data.shape[0] * block_size * hk)  # K and V of one head, scales
        rows = max(16, triton.next_power_of_2(q_per_seq * (hq // hk)))
        return {"_decode_kernel": attention._decode_block_n(q, cache, rows) * per_key}


# Gated DeltaNet layers (Qwen3.5): key heads, value heads, head dim (keys and values alike)
GDN_MODELS = {"qwen3.5-27b": (16, 48, 128), "qwen3.5-9b": (16, 32, 128)}


def _gdn_batch(step: str):
    """cu_seqlens and state slots: decode (4 sequences, one token each) or a 300-token prefill chunk."""
    lengths = [1, 1, 1, 1] if step == "decode" else [300]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return cu, torch.arange(len(lengths), dtype=torch.int32), sum(lengths)


def case_causal_conv1d(step: str, model: str, dtype: str, kernel: int = 4):
    hk, hv, d = GDN_MODELS[model]
    channels = 2 * hk * d + hv * d
    cu, slots, t = _gdn_batch(step)
    x = _randn(t, channels + hv * d, dtype=DTYPES[dtype])[:, :channels]  # a view, as in_proj's output
    state = torch.zeros(4, channels, kernel - 1, dtype=DTYPES[dtype])
    _op("conv1d").causal_conv1d(x, _randn(channels, kernel, dtype=DTYPES[dtype]), state, cu, slots)


def case_gated_delta_rule(step: str, model: str, dtype: str, chunked: bool | None = None):
    hk, hv, d = GDN_MODELS[model]
    cu, slots, t = _gdn_batch(step)
    conv = _randn(t, (2 * hk + hv) * d, dtype=DTYPES[dtype])
    q, k = conv[:, : hk * d].view(t, hk, d), conv[:, hk * d : 2 * hk * d].view(t, hk, d)
    v = conv[:, 2 * hk * d :].view(t, hv, d)
    g, beta = -torch.rand(t, hv), torch.rand(t, 2 * hv).to(DTYPES[dtype])[:, :hv]
    state = torch.zeros(4, hv, d, d)
    _op("gated_delta").gated_delta_rule(q, k, v, g, beta, state, cu, slots, chunked=chunked)


def case_quant_matmul(
    bits: int,
    m: int,
    dtype: str,
    n: int = 17408,
    k: int = 5120,
    group: int = 128,
    cuda_cores: bool | None = None,
    prefetch: bool = False,
    half2: bool = False,
    act_order: bool = False,
):
    """engine/quant/groupwise.py's layout: 4-bit asymmetric (codes two per byte, scale and minimum per
    group), 6-bit asymmetric (four codes per 3 bytes), 8-bit symmetric. cuda_cores: the GEMV at M = 1 on
    the CUDA cores (kernels/quant_matmul/gemv4.py, gemv6.py, gemv8.py) or the tensor-core one, else the
    default. prefetch: gemv4.py's register prefetch knob; half2: gemv4h.py (two codes an f16x2 FMA);
    act_order: x's columns loaded through a column order (an act-order checkpoint's)."""
    packed, scales, minimums = zero_packed(n, k=k, bits=bits, group=group)
    op = _op("quant_matmul")
    x = _randn(m, k, dtype=DTYPES[dtype])
    knobs = dict(cuda_cores=cuda_cores, prefetch=prefetch, half2=half2)
    columns = torch.randperm(k).to(torch.int32) if act_order else None
    op.quant_matmul(x, packed, scales, minimums, bits, group, **knobs, columns=columns)
    row_bytes = group * bits // 8 + 2 + 2 * (minimums is not None)  # codes, scale and minimum of a group
    if cuda_cores is None:
        cuda_cores = op.GEMV_CUDA_CORES and bits in op.CUDA_CORE_GEMV_WIDTHS
    if (m == 1 or half2) and cuda_cores:
        kernel = "gemv4_half2_kernel" if half2 else f"gemv{bits}_cuda_cores_kernel"
        return {kernel: op.cuda_core_gemv_block_n(bits, group) * row_bytes}
    if m <= op.GEMV_MAX_M:  # the GEMV streams its weight tile: each row's group
        return {"_quant_matmul_kernel": op.gemv_block_n(bits, torch.device("cpu")) * row_bytes}


def zero_packed(*rows: int, k: int, bits: int, group: int = 128):
    """Zero codes of a [*rows, K] matrix (or stack) in engine/quant/groupwise.py's layout, with random fp16
    scales and, below 8 bits, minimums: (packed, scales, minimums)."""
    width = {4: k // 2, 6: k // 4 * 3, 8: k}[bits]
    packed = torch.zeros(*rows, width, dtype=torch.int8 if bits == 8 else torch.uint8)
    scales = torch.rand(*rows, k // group).half()
    return packed, scales, None if bits == 8 else -scales


def case_dequantize(bits: int, dtype: str, n: int = 5824, k: int = 5120, group: int = 128):
    """Long prefill chunks: a slice of weight rows dequantized into the cuBLAS scratch (kernels/quant_matmul/
    dequant.py), the same layouts as case_quant_matmul."""
    packed, scales, minimums = zero_packed(n, k=k, bits=bits, group=group)
    out = torch.empty(n, k, dtype=DTYPES[dtype])
    dequant = importlib.import_module("ninfer_kernels.quant_matmul.dequant")
    dequant.dequantize_rows(packed, scales, minimums, bits, group, 0, out)


def case_fp4_matmul(fmt: str, m: int, dtype: str, n: int = 17408, k: int = 5120):
    """An NVFP4 (e4m3 scales a 16) or MXFP4 (e8m0 a 32) checkpoint's matrix as stored (kernels/fp4_matmul):
    the split-K GEMVs up to 16 rows, the tile kernel by 16-row blocks to 63, the dequantized slices from 64
    (their dequantization kernel)."""
    group, e8m0 = (32, True) if fmt == "mxfp4" else (16, False)
    packed = torch.zeros(n, k // 2, dtype=torch.uint8)
    scales = torch.full((n, k // group), 0x38, dtype=torch.uint8)
    op = _op("fp4_matmul")
    op.fp4_matmul(_randn(m, k, dtype=DTYPES[dtype]), packed, scales, torch.ones(n), group, e8m0)
    step_bytes = 128 // 2 + 128 // group  # a row's codes and scale bytes over a step's 128 columns
    if m == 1:  # the CUDA cores (kernels/fp4_matmul/gemv.py)
        return {"fp4_gemv_cuda_cores_kernel": op.GEMV_BLOCK_N * step_bytes}
    if m <= 16:  # the tensor-core tile
        return {"_fp4_gemv_kernel": op.TILE_GEMV_BLOCK_N * step_bytes}


def case_quantize_act(dtype: str, m: int = 2048, k: int = 17408, group: int = 128):
    """A prefill chunk's activations quantized to int8 per (token, group) for the int8 matmul."""
    _op("int8_act").quantize_act(_randn(m, k, dtype=DTYPES[dtype]), group)


def case_int8_matmul(bits: int, m: int, dtype: str, n: int = 17408, k: int = 5120, group: int = 128):
    """The int8 prefill matmul: case_quant_matmul's weight layouts times int8 codes of x per (row, group)."""
    groups = k // group
    packed, scales, minimums = zero_packed(n, k=k, bits=bits, group=group)
    codes = torch.zeros(m, k, dtype=torch.int8)
    x_scales, x_sums = torch.rand(m, groups), torch.zeros(m, groups, dtype=torch.int32)
    out = torch.empty(m, n, dtype=DTYPES[dtype])
    _op("int8_matmul").int8_matmul(codes, x_scales, x_sums, packed, scales, minimums, bits, group, out)


def case_fused_moe(
    bits: int | str, tokens: int, dtype: str = "bf16", experts: int = 128, k: int = 8, act_order: bool = False
):
    """Qwen3-30B-A3B's sparse MLP (H 2048, I 768, 8 of 128 experts): dense (bits 16), packed or NVFP4 experts, a
    decode step (1 token: 16-assignment blocks) or a prompt chunk (64-assignment blocks); `act_order`: each
    expert's columns in an order of its own (x gathered)."""
    hidden, inter = 2048, 768
    moe = _op("fused_moe")
    packed_experts = importlib.import_module("ninfer_kernels.fused_moe.naive").PackedExperts

    def experts_of(n, kk):
        if bits == 16:
            return _randn(experts, n, kk, dtype=DTYPES[dtype])
        if bits == "nvfp4":  # an FP4 checkpoint's experts as stored (codes, e4m3 scale bytes, multipliers)
            codes = torch.zeros(experts, n, kk // 2, dtype=torch.uint8)
            scale_codes = torch.full((experts, n, kk // 16), 0x38, dtype=torch.uint8)
            fp4 = importlib.import_module("ninfer_kernels.fused_moe.naive").Fp4Experts
            return fp4(codes, scale_codes, torch.ones(experts, n), 16, False, kk)
        columns = _randn(experts, kk, dtype=torch.int32) if act_order else None
        return packed_experts(*zero_packed(experts, n, k=kk, bits=bits), bits, 128, kk, columns)

    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k)
    x = _randn(tokens, hidden, dtype=DTYPES[dtype])
    moe.fused_moe(x, experts_of(2 * inter, hidden), experts_of(hidden, inter), weights, ids)


def case_quant_embedding(bits: int, dtype: str, vocab: int = 1000, dim: int = 5120):
    """A packed table (any width), rows dequantized on lookup."""
    packed, scales, minimums = zero_packed(vocab, k=dim, bits=bits)
    ids = torch.tensor([0, 5, 999])
    _op("quant_embedding").quant_embedding(ids, packed, scales, minimums, bits, 128, dim, DTYPES[dtype])


def case_race_noise(vocab: int):
    """The race's noise for a sampler's rows (or a drafter's) over a model's vocabulary."""
    _op("race_noise").race_noise(torch.tensor([0, -1, 2**62]), vocab)


def cases() -> list[tuple[str, callable, dict, int]]:
    """(name, function, arguments, lowest capability it applies to)."""
    out = []

    def add(fn, min_arch=0, **kw):
        name = fn.__name__.removeprefix("case_") + "[" + ",".join(str(v) for v in kw.values()) + "]"
        out.append((name, fn, kw, min_arch))

    for dtype in DTYPES:
        for dim in (576, 5120):
            for variant in ("plain", "residual", "zero_centered"):
                add(case_rmsnorm, dtype=dtype, dim=dim, variant=variant)
        add(case_rmsnorm_gated, dtype=dtype, dim=128)
        add(case_silu_mul, dtype=dtype, inter=1536)
        add(case_silu_mul, dtype=dtype, inter=17408)
        for model, rotary in (("smollm2", 64), ("qwen3", 128), ("qwen3.5", 64)):
            add(case_rope, dtype=dtype, model=model, rotary_dim=rotary)
    for vocab in (49152, 151936):
        add(case_race_noise, vocab=vocab)
    for kv in KV_DTYPES:
        min_arch = FP8_MIN_ARCH if kv == "fp8" else 0
        for model in ("smollm2", "qwen3", "qwen3.5"):
            add(case_kv_store, min_arch, kv_dtype=kv, model=model, dtype="bf16")
            for step in ("prefill", "decode", "verify"):
                add(case_attention, min_arch, step=step, kv_dtype=kv, model=model, dtype="bf16")
        add(case_attention, min_arch, step="verify_max", kv_dtype=kv, model="qwen3.5", dtype="bf16")
        if kv in ("int8", "k8v4"):
            for model in ("smollm2", "qwen3", "qwen3.5"):
                add(case_attention, step="prefill_int8q", kv_dtype=kv, model=model, dtype="bf16")
    for dtype, kv in (("fp16", "fp16"), ("fp32", "fp32"), ("fp16", "k8v4")):
        add(case_kv_store, kv_dtype=kv, model="qwen3", dtype=dtype)
        for step in ("prefill", "decode"):
            add(case_attention, step=step, kv_dtype=kv, model="qwen3", dtype=dtype)
    for step in ("prefill", "decode"):
        add(case_attention, step=step, kv_dtype="bf16", model="mha", dtype="bf16")
    for model in ("qwen3", "qwen3.5"):
        add(case_attention, step="prefill_long", kv_dtype="bf16", model=model, dtype="bf16")
    for context in (1024, 32768, 131072):  # decode at short and deep context: split counts differ
        add(case_attention, step="decode", kv_dtype="k8v4", model="qwen3.5", dtype="bf16", context=context)
    for model in GDN_MODELS:
        for step in ("decode", "prefill"):
            for dtype in DTYPES:
                add(case_causal_conv1d, step=step, model=model, dtype=dtype)
                add(case_gated_delta_rule, step=step, model=model, dtype=dtype)
        # fp32 operands through the chunked form (an fp32 model takes the recurrent one; tests force it): two
        # pipeline stages on SM 9.0, one where those do not fit (gated_delta.triton._scan_stages)
        add(case_gated_delta_rule, step="prefill", model=model, dtype="fp32", chunked=True)
    for bits in (4, 6, 8):
        for m in (1, 3, 16, 77):
            add(case_quant_matmul, bits=bits, m=m, dtype="bf16")
    add(case_quant_matmul, bits=4, m=1, dtype="fp16")
    for dtype in ("bf16", "fp16"):  # the 4-bit GEMV at M = 1 on the CUDA cores and on the tensor cores
        for cuda_cores in (False, True):
            add(case_quant_matmul, bits=4, m=1, dtype=dtype, cuda_cores=cuda_cores)
    # a GEMV wide enough for one K slice (a vocabulary head): stored directly, no split-K adds
    add(case_quant_matmul, bits=4, m=1, dtype="bf16", n=140000, k=1024)
    for m in (1, 77):  # 4-bit groups of 32 (a GGUF's Q4 blocks, q4.6 upgrades): two products a group
        add(case_quant_matmul, bits=4, m=m, dtype="bf16", n=576, k=1536, group=32)
    for bits in (4, 8):  # a GGUF's Q4_x / Q8_0 blocks as the GPU holds them, at the 27B MLP's shape
        add(case_quant_matmul, bits=bits, m=1, dtype="bf16", group=32)
    add(case_quant_matmul, bits=4, m=1, dtype="bf16", group=32, cuda_cores=False)  # (M = 2-16's kernel)
    add(case_quant_matmul, bits=6, m=1, dtype="bf16", cuda_cores=False)
    add(case_quant_matmul, bits=4, m=1, dtype="bf16", group=128, cuda_cores=True, prefetch=True)  # (a knob)
    for m in (1, 2, 4):  # f16x2 (a knob: gemv4h.py), 1-4 activation rows a program
        add(
            case_quant_matmul,
            bits=4,
            m=m,
            dtype="bf16",
            group=128,
            cuda_cores=True,
            prefetch=False,
            half2=True,
        )
    for group in (128, 32):  # the 8-bit GEMV on the CUDA cores (a tuning knob: gemv8.py)
        add(case_quant_matmul, bits=8, m=1, dtype="bf16", group=group, cuda_cores=True)
    # an act-order checkpoint's column order, loaded with x: each GEMV at M = 1, M = 4's, the GEMM's
    for bits, m in ((4, 1), (6, 1), (4, 4), (8, 1), (4, 40)):
        add(case_quant_matmul, bits=bits, m=m, dtype="bf16", act_order=True)
    add(case_quant_matmul, bits=4, m=2, dtype="bf16", cuda_cores=True, half2=True, act_order=True)
    add(case_quant_matmul, bits=8, m=1, dtype="bf16", cuda_cores=True, act_order=True)
    for bits in (4, 6, 8):
        add(case_quant_embedding, bits=bits, dtype="bf16")
        add(case_dequantize, bits=bits, dtype="bf16")
    add(case_dequantize, bits=4, dtype="fp16")
    add(case_quant_matmul, bits=4, m=77, dtype="fp16")
    for fmt in ("nvfp4", "mxfp4"):
        for m in (1, 16, 33, 77):
            add(case_fp4_matmul, fmt=fmt, m=m, dtype="bf16")
    add(case_fp4_matmul, fmt="nvfp4", m=1, dtype="fp16")
    for dtype in DTYPES:
        add(case_quantize_act, dtype=dtype)
    for bits in (4, 6, 8):  # the int8 prefill path: a short chunk (64-row tiles) and a long one (128)
        for m in (48, 2048):
            add(case_int8_matmul, bits=bits, m=m, dtype="bf16")
    add(case_int8_matmul, bits=4, m=2048, dtype="fp16")
    add(case_int8_matmul, bits=4, m=2048, dtype="bf16", n=576, k=1536, group=32)  # a GGUF's Q4 blocks
    for bits in (16, 4, 6, 8, "nvfp4"):
        for tokens in (1, 256):
            add(case_fused_moe, bits=bits, tokens=tokens)
    for tokens in (1, 256):  # act-order experts (GPTQ desc_act)
        add(case_fused_moe, bits=4, tokens=tokens, act_order=True)
    return out


# ------------------------------------------------------------------------------------------- the checks


def _ptxas_info(kernel, arch: int) -> tuple[int | None, int | None]:
    """(registers per thread, spill bytes) as ptxas -v reports them for the kernel: Triton's own report
    where it compiled the variant in this process, else ptxas run again on its PTX (a cached variant)."""
    from triton.backends.nvidia.compiler import get_ptxas

    info = _ptxas_logs.get(kernel.metadata.hash)
    if info is None:
        ptx = kernel.asm["ptx"]
        target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "k.ptx"
            src.write_text(ptx)
            options = [*_triton_ptxas_options(kernel), f"--gpu-name={target.group(1)}"]
            cmd = [get_ptxas(arch).path, "-v", *options, str(src), "-o", f"{src}.o"]
            info = _ptxas_logs[kernel.metadata.hash] = subprocess.run(
                cmd, capture_output=True, text=True
            ).stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    return (int(regs.group(1)) if regs else None), (max(spills) if spills else None)


def _triton_ptxas_options(kernel) -> list[str]:
    """The options this Triton's own ptxas run gives a kernel (its make_cubin), so that a cached variant's
    registers and spills are reported as Triton's compile got them: line info, --fmad=false without fp
    fusion, the kernel's ptx_options, and --regAllocOptLevel=2 where this Triton passes it (3.9 does, for
    a ptxas 13 bug; without it, some 255-register kernels spill 8-12 bytes more)."""
    from triton.backends.nvidia.compiler import CUDABackend

    meta = kernel.metadata
    options = ["-lineinfo"]
    if not getattr(meta, "enable_fp_fusion", True):
        options.append("--fmad=false")
    if "regAllocOptLevel=2" in inspect.getsource(CUDABackend.make_cubin):
        options.append("--regAllocOptLevel=2")
    return options + (getattr(meta, "ptx_options", None) or "").split()


@functools.cache
def _sass(cubin: bytes) -> str:
    nvdisasm = triton.knobs.nvidia.nvdisasm.path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True, check=True).stdout


def _hottest_loop_lines(sass: str) -> list[str]:
    """SASS lines of the longest loop: from a label to the last backward branch to it (the compiler lays out
    a Triton kernel's main loop as one such block)."""
    lines = sass.splitlines()
    labels, best = {}, []
    for i, line in enumerate(lines):
        label = re.match(r"^\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = i
        branch = re.search(r"BRA\s+`\(\.(L_x_\d+)\)", line)
        if branch and labels.get(branch.group(1), i) < i and i - labels[branch.group(1)] > max(len(best), 2):
            best = lines[labels[branch.group(1)] : i + 1]
    return best


def hottest_loop(loop: list[str]) -> list[str]:
    """Opcodes of a loop's SASS lines (_hottest_loop_lines)."""
    ops = (re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line) for line in loop)
    return [op.group(1) for op in ops if op]


def copies_in_flight(loop: list[str]) -> int | None:
    """Async copy groups the loop keeps in flight across its waits (see Compiled.copies_in_flight)."""
    if not any("LDGSTS" in line for line in loop):
        return None
    waits = [int(n, 16) for n in re.findall(r"DEPBAR\.LE\s+SB0,\s*0x([0-9a-f]+)", "\n".join(loop))]
    return min(waits, default=0)


def _loop_cost(compiled: Compiled, cubin: bytes, loop_bytes: int | None, arch: int) -> None:
    loop = _hottest_loop_lines(_sass(cubin))
    compiled.loop_instructions = len(hottest_loop(loop))
    compiled.copies_in_flight = copies_in_flight(loop)
    if loop_bytes and compiled.loop_instructions:
        compiled.loop_bytes = loop_bytes
        per_kb = compiled.loop_instructions * compiled.num_warps * 1024 / loop_bytes
        compiled.instructions_per_kb = round(per_kb, 1)
        if arch in REFERENCE_GPU:
            _, bandwidth, sms, clock = REFERENCE_GPU[arch]
            compiled.issue_cap = round(
                min(1.0, ISSUE_PER_CLOCK * 1024 / per_kb / (bandwidth / sms / clock)), 3
            )


def run_case(
    name: str, fn, kwargs: dict, arch: int, ptxas_info: bool, sass: frozenset[str] | None = None
) -> Result:
    """Compile one case. sass: the kernels to disassemble (empty: every one; None: none)."""
    driver.set_active(_CompileOnlyDriver(arch))
    _launched.clear()
    start = time.perf_counter()
    try:
        loop_bytes = fn(**kwargs) or {}  # {kernel: bytes a program streams per loop iteration}
    except Exception as exc:  # a compile error starts with the kernel's line and column, ends with the cause
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [""]
        message = lines[0] if len(lines) == 1 else f"{lines[0]} {lines[-1]}"
        return Result(name, arch, False, time.perf_counter() - start, f"{type(exc).__name__}: {message}")
    result = Result(name, arch, True, time.perf_counter() - start)
    for kernel_name, kernel in _launched:
        meta = kernel.metadata
        compiled = Compiled(kernel_name, meta.shared, meta.num_warps, meta.num_stages, meta.hash[:16])
        versions = re.findall(r"nvidia_mma<\{versionMajor = (\d+)", kernel.asm.get("ttgir", ""))
        compiled.mma = max(map(int, versions)) if versions else None
        if ptxas_info:
            compiled.registers, compiled.spill_bytes = _ptxas_info(kernel, arch)
        if sass is not None and (not sass or kernel_name in sass):
            _loop_cost(compiled, kernel.asm["cubin"], loop_bytes.get(kernel_name), arch)
        if meta.shared > SHARED_LIMIT.get(arch, 101376):
            result.ok = False
            result.error = (
                f"{kernel_name} needs {meta.shared} bytes of shared memory; SM{arch} has {SHARED_LIMIT[arch]}"
            )
        result.kernels.append(compiled)
    return result


def _kernel_names() -> set[str]:
    """Every launched @triton.jit function of the ops (kernels/<op>/triton.py: _*_kernel by convention)."""
    ops = Path(__file__).resolve().parents[1] / "kernels"
    modules = [_op(path.parent.name) for path in ops.glob("*/triton.py")]
    jitted = {name for m in modules for name, obj in vars(m).items() if isinstance(obj, JITFunction)}
    return {name for name in jitted if name.endswith("_kernel")}


def variants_per_kernel() -> dict[str, int]:
    """Compiled variants per kernel and target, from the JIT caches."""
    counts = {}
    for module in sys.modules.values():
        if getattr(module, "__name__", "").startswith("ninfer_kernels.") and module.__name__.endswith(
            ".triton"
        ):
            for name, obj in vars(module).items():
                if isinstance(obj, JITFunction):
                    for arch, cache in obj.device_caches.items():
                        if cache[0]:
                            counts[f"SM{arch} {name}"] = len(cache[0])
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="86,90", help="compute capabilities, e.g. 80,86,89,90,120")
    parser.add_argument(
        "-k", dest="select", default="", help="only cases whose name contains this (or one of A|B|...)"
    )
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--no-ptxas-info", action="store_true", help="skip the registers / spills report")
    parser.add_argument(
        "--sass",
        nargs="?",
        const="",
        metavar="KERNELS",
        help="count the hottest loop's instructions (per KB where streaming); of the named kernels only",
    )
    args = parser.parse_args(argv)
    arches = [int(a) for a in args.arch.split(",")]
    unknown = [a for a in arches if a not in SHARED_LIMIT]
    if unknown:
        parser.error(f"unknown compute capability {unknown}; use some of {sorted(SHARED_LIMIT)}")
    sass = None if args.sass is None else frozenset(filter(None, args.sass.split(",")))
    unknown = sorted((sass or set()) - _kernel_names())
    if unknown:
        parser.error(f"--sass names no kernel {unknown}; use some of {sorted(_kernel_names())}")
    JITFunction.run = _compile_only_run
    triton.knobs.nvidia.dump_ptxas_log = True  # registers and spills from the compile itself (_ptxas_info)
    torch.manual_seed(0)
    targets = ", ".join(f"SM{a} ({DEVICES[a]})" if a in DEVICES else f"SM{a}" for a in arches)
    print(f"triton {triton.__version__}, torch {torch.__version__}; targets: {targets}")
    results = []
    for arch in arches:
        for name, fn, kwargs, min_arch in cases():
            if not any(part in name for part in args.select.split("|")) or arch < min_arch:
                continue
            r = run_case(name, fn, kwargs, arch, not args.no_ptxas_info, sass)
            results.append(r)
            detail = r.error or "  ".join(
                f"{c.kernel} smem {c.shared} warps {c.num_warps}"
                + (f" mma v{c.mma}" if c.mma else "")
                + (f" regs {c.registers} spill {c.spill_bytes}" if c.registers is not None else "")
                + (f" loop {c.loop_instructions}" if c.loop_instructions else "")
                + (f" in flight {c.copies_in_flight}" if c.copies_in_flight is not None else "")
                + (
                    f" = {c.instructions_per_kb:.0f}/KB, issue cap {c.issue_cap:.0%}"
                    if c.instructions_per_kb
                    else ""
                )
                for c in r.kernels
            )
            print(f"SM{arch} {'ok  ' if r.ok else 'FAIL'} {r.seconds:5.1f}s {name}: {detail}", flush=True)
    failed = [r for r in results if not r.ok]
    spilling = sorted({(r.arch, c.kernel) for r in results for c in r.kernels if c.spill_bytes})
    variants = variants_per_kernel()
    print("compiled variants:", ", ".join(f"{k} {v}" for k, v in sorted(variants.items())))
    if spilling:
        print("kernels that spill registers:", ", ".join(f"SM{a} {k}" for a, k in spilling))
    print(
        f"{len(results) - len(failed)} of {len(results)} cases compiled for SM {', '.join(map(str, arches))}"
    )
    if args.json:
        payload = {
            "triton": triton.__version__,
            "arches": arches,
            "results": [asdict(r) for r in results],
            "variants": variants,
        }
        args.json.write_text(json.dumps(payload, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
