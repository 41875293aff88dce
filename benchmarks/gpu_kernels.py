"""Microbenchmarks of the Triton kernels on a CUDA device: shape, time, achieved GB/s or TFLOP/s and % of
the device's peak, as a markdown table (and JSON with --json FILE).

Shapes are the Qwen3.5-27B ones (hidden 5120, 24 q heads / 4 kv heads x 256, MLP 17408; Gated DeltaNet 16
key / 48 value heads x 128, conv kernel 4), random data.

    python benchmarks/gpu_kernels.py [--json FILE] [--markdown FILE] [--sections decode_attention,sweeps]
    python benchmarks/gpu_kernels.py --compile-only 90   # on a machine without a GPU: no timings

--compile-only ARCH runs every section on CPU tensors with each launch compiled for that compute capability
and not run (scripts/cuda_compile_check.py's driver), so a lease is not spent finding a configuration
that does not compile, needs more shared memory than the device has, or a section that raises.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

from engine.cache.kv_layout import KVCache
from engine.quant.groupwise import QuantizedTensor, quantize
from engine.vision.config import VisionConfig
from engine.vision.tower import VisionTower
from ninfer_kernels.conv1d import triton as conv1d_triton
from ninfer_kernels.fp4_matmul import triton as fp4_matmul_triton
from ninfer_kernels.fused_moe import naive as fused_moe_naive
from ninfer_kernels.fused_moe import triton as fused_moe_triton
from ninfer_kernels.gated_delta import triton as gated_delta_triton
from ninfer_kernels.int8_act import triton as int8_act_triton
from ninfer_kernels.int8_matmul import triton as int8_matmul_triton
from ninfer_kernels.kv_store import triton as kv_store_triton
from ninfer_kernels.paged_attention import num_decode_splits
from ninfer_kernels.paged_attention import triton as attention
from ninfer_kernels.quant_matmul import dequant as quant_dequant
from ninfer_kernels.quant_matmul import triton as quant_matmul_triton
from ninfer_kernels.rmsnorm import triton as rmsnorm_triton
from ninfer_kernels.rope import triton as rope_triton
from ninfer_kernels.silu_mul import triton as silu_mul_triton
from ninfer_kernels.triton_config import interpreting

DEVICE = "cuda"
COMPILE_ONLY: int | None = None  # --compile-only's compute capability
_too_big: list[str] = []  # --compile-only: kernels needing more shared memory than the target has
_row_error: list[str] = []  # the error of the row being measured, named by record() (at most one)
# gemv4h.py (the half2 knob) against the dequantized weight at the timed shape, M = 1-4, in a child process:
# its inline PTX first runs on a GPU here, and an illegal instruction would break this process's CUDA
# context for every row after it
HALF2_CHECK = """
import torch
from engine.quant.groupwise import quantize
from ninfer_kernels.quant_matmul import naive, triton as fused
qt = quantize(torch.randn(17408, 5120, generator=torch.Generator().manual_seed(0)) * 0.02, 4, 128, False)
p, s, z = (t.cuda() for t in (qt.packed, qt.scales, qt.minimums))
for dtype in (torch.bfloat16, torch.float16):
    for m in (1, 2, 3, 4):
        x = torch.randn(m, 5120, device="cuda").to(dtype)
        want = naive.quant_matmul(x.float(), p, s, z, 4, 128)
        got = fused.quant_matmul(x, p, s, z, 4, 128, cuda_cores=True, half2=True).float()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 1e-2, f"M={m} {dtype}: RMS-relative error {err:.1e} against the dequantized weight"
        print(f"half2 M={m} {dtype}: RMS-relative error {err:.1e}")
"""

# dense peaks (no sparsity): HBM bytes/s and bf16 tensor FLOP/s
PEAKS = {
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
    "RTX 3090": (936e9, 71e12),
    "A100": (2.0e12, 312e12),
}


def capability() -> tuple[int, int]:
    return divmod(COMPILE_ONLY, 10) if COMPILE_ONLY else torch.cuda.get_device_capability()


def compile_only(arch: int) -> None:
    """Make every launch a compile-only warmup for `arch` on CPU tensors, noting kernels past its shared
    memory (what a GPU refuses at launch)."""
    global DEVICE, COMPILE_ONLY
    if interpreting():  # (checked before the import below, which clears the variable)
        raise SystemExit("--compile-only compiles the kernels for a GPU: run it without TRITON_INTERPRET=1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import cuda_compile_check as check
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    if arch not in check.SHARED_LIMIT:
        raise SystemExit(f"unknown compute capability {arch}; use one of {sorted(check.SHARED_LIMIT)}")
    DEVICE, COMPILE_ONLY = "cpu", arch

    def run(self, *args, grid, warmup, **kwargs):
        kernel = check._JIT_RUN(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel.metadata.shared > check.SHARED_LIMIT[arch]:
            tile = " ".join(
                f"{k}={v}" for k, v in kwargs.items() if k.startswith("BLOCK") or k.startswith("num_")
            )
            _too_big.append(
                f"{self.fn.__name__} ({tile}) needs {kernel.metadata.shared} bytes of shared memory"
            )
        return kernel

    JITFunction.run = run
    driver.set_active(check._CompileOnlyDriver(arch))


def device_peaks() -> tuple[float, float, str]:
    if COMPILE_ONLY:
        return float("nan"), float("nan"), f"SM {COMPILE_ONLY}, compiled only (no timings)"
    name = torch.cuda.get_device_name()
    for key, (bw, flops) in PEAKS.items():
        if key in name:
            return bw, flops, f"{name} (table)"
    try:  # memory clock x bus width from NVML for other cards
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        clock = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) * 1e6
        bw = clock * 2 * pynvml.nvmlDeviceGetMemoryBusWidth(h) / 8
        return bw, float("nan"), f"{name} (NVML memory clock x bus width)"
    except Exception:  # noqa: BLE001 - any NVML failure: no peak, the table shows n/a
        return float("nan"), float("nan"), name


def bench(fn, triton_kernels: bool = True) -> float:
    """Seconds a call of fn takes on the GPU. --compile-only: fn is called once to compile its Triton
    kernels, or not at all when it has none or another row compiles them (triton_kernels=False: a torch
    baseline, the cuBLAS products of the dequantized path)."""
    if COMPILE_ONLY:
        if triton_kernels:
            _row(fn)
        return float("nan")
    # (do_bench clears the L2 cache before each call: weights of 45 MB do not stay in an H200's 60 MB)
    return _row(lambda: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3)


def _row(run) -> float:
    """run(), or NaN where it raises (a configuration that does not compile, or needs more shared memory
    than the device has): the failure costs its row, said at once and named by record(), not the section's
    other rows."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001
        lines = str(exc).strip().splitlines() or [""]  # (a compile error's cause is its last line)
        _row_error[:] = [f"{type(exc).__name__}: {lines[-1]}"]
        print("row failed:", _row_error[0], flush=True)
        return float("nan")


def bench_graphed(fns, calls: int = 32) -> float:
    """Seconds a call takes on the GPU with no host in the way: `calls` calls, cycling through `fns` (the
    same op over different inputs, so that what one call reads is not in L2 for the next), captured in a
    CUDA graph and replayed, as the engine's decode steps run; the median of 5 replays. do_bench times
    each call after the host launches it, so a wrapper's host time (Python, the launch: tens of µs) can
    set a floor under a decode-sized kernel; this does not. --compile-only: each fn called once."""
    if COMPILE_ONLY:
        return _row(lambda: _compile_each(fns))
    seconds = _row(lambda: _graph_replay_seconds(fns, calls))
    if math.isnan(seconds):  # a capture that failed: its stream's work done before the next row
        torch.cuda.synchronize()
    return seconds


def _compile_each(fns) -> float:
    for fn in fns:
        fn()
    return float("nan")


def _graph_replay_seconds(fns, calls: int) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compiled, and the process-wide buffers made, before the capture
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return sorted(times)[2]


def raise_clocks(seconds: float = 2.0) -> None:
    """Keep the GPU busy with bf16 products for `seconds` before the first row: an idle card's clocks are
    low (an H200 read 345 MHz idle against 1980 MHz loaded), and the first rows measured otherwise run
    while they climb. The card's settings are left alone; this only asks for work."""
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def randn(*shape, **options) -> torch.Tensor:
    """Random normal data; --compile-only: uninitialised (a launch that only compiles reads no values)."""
    return torch.empty(*shape, **options) if COMPILE_ONLY else torch.randn(*shape, **options)


def decode_case(kv_dtype: str, context: int, batch: int = 1):
    num_q, num_kv, head_dim, block_size = 24, 4, 256, 16
    blocks_per_seq = context // block_size
    cache = KVCache.allocate(kv_dtype, batch * blocks_per_seq, block_size, num_kv, head_dim, DEVICE)
    for t in (cache.k_data, cache.v_data) if not COMPILE_ONLY else ():
        t.view(torch.uint8).random_(0, 120)  # finite values of any dtype
    for t in (cache.k_scale, cache.v_scale):
        if t is not None:
            t.fill_(0.01)
    table = torch.arange(batch * blocks_per_seq, dtype=torch.int32, device=DEVICE).view(batch, -1)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    q = randn(batch, num_q, head_dim, device=DEVICE, dtype=torch.bfloat16)
    return q, cache, table, seq_lens


PREFILL_TOKENS = 8192
PREFILL_FLOPS = 2 * 2 * 24 * 256 * PREFILL_TOKENS * PREFILL_TOKENS / 2  # QK^T and PV, causal half


def prefill_case(kv_dtype: str = "bf16"):
    """8K new tokens of one sequence, causal: (q, cache, block_table, seq_lens, cu_seqlens)."""
    _, cache, table, seq_lens = decode_case(kv_dtype, PREFILL_TOKENS)
    q = randn(PREFILL_TOKENS, 24, 256, device=DEVICE, dtype=torch.bfloat16)
    return q, cache, table, seq_lens, torch.tensor([0, PREFILL_TOKENS], dtype=torch.int32, device=DEVICE)


@functools.cache
def up_proj(bits: int, group: int = 128):
    """The 27B MLP up projection (N = 17408 outputs, K = 5120) quantized at `bits` in groups of `group`, on
    the GPU: (QuantizedTensor, packed, scales, minimums). Built once per width and group (the CPU
    quantization takes seconds; --compile-only: zero codes in the same layout, the values unread)."""
    if COMPILE_ONLY:  # (compile_only put scripts/ on the path)
        import cuda_compile_check as check

        qt = QuantizedTensor(
            bits, group, (17408, 5120), *check.zero_packed(17408, k=5120, bits=bits, group=group)
        )
    else:
        w = torch.randn(17408, 5120, generator=torch.Generator().manual_seed(0)) * 0.02
        qt = quantize(w, bits, group, False)
    mins = qt.minimums.to(DEVICE) if qt.minimums is not None else None
    return qt, qt.packed.to(DEVICE), qt.scales.to(DEVICE), mins


@functools.cache
def up_proj_copies(bits: int, n: int = 4, group: int = 128) -> list[tuple]:
    """n copies of up_proj(bits, group)'s packed weight, scales and minimums (4 x 45 MB at 4 bits: past an
    H200's 60 MB of L2 when a graph cycles through them); --compile-only: the same tensors (nothing is
    read)."""
    _, packed, scales, mins = up_proj(bits, group)
    if COMPILE_ONLY:
        return [(packed, scales, mins)]
    return [(packed.clone(), scales.clone(), None if mins is None else mins.clone()) for _ in range(n)]


@functools.cache
def fp4_up_proj_copies(group: int, n: int = 4) -> list[tuple]:
    """n copies of the 27B MLP up projection as an FP4 checkpoint stores it (random codes; scale codes of
    1.0, e4m3 0x38 or e8m0 127; unit multipliers): (packed, scale_codes, multiplier) each, 4 x 49 MB (past
    an H200's L2); --compile-only: one copy on the CPU."""
    codes = torch.randint(0, 256, (17408, 2560), dtype=torch.uint8, device=DEVICE)
    scales = torch.full(
        (17408, 5120 // group), 127 if group == 32 else 0x38, dtype=torch.uint8, device=DEVICE
    )
    ones = torch.ones(17408, device=DEVICE)
    return [(codes.clone(), scales.clone(), ones.clone()) for _ in range(1 if COMPILE_ONLY else n)]


@functools.cache
def half2_failure() -> str | None:
    """Why the half2 rows are left out (HALF2_CHECK failed, in a line), or None: they run (and under
    --compile-only, which runs nothing)."""
    if COMPILE_ONLY:
        return None
    try:
        run = subprocess.run([sys.executable, "-c", HALF2_CHECK], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "half2 (gemv4h.py): its check ran past 300 s; its rows left out"
    print(run.stdout, end="", flush=True)
    if run.returncode == 0:
        return None
    lines = (run.stderr or run.stdout).strip().splitlines() or [f"exit {run.returncode}"]
    return f"half2 (gemv4h.py) failed its check on this GPU, its rows left out: {lines[-1]}"


def gemv_calls(x, copies: list[tuple], bits: int, group: int = 128, **knobs) -> list:
    """One quant_matmul call per weight copy (bench_graphed's fns)."""
    return [
        lambda p=p, s=s, z=z: quant_matmul_triton.quant_matmul(x, p, s, z, bits, group, **knobs)
        for p, s, z in copies
    ]


@triton.jit
def _read_reference_kernel(
    src_ptr, out_ptr, N, row_words, words_per_split, BLOCK_N: tl.constexpr, WORDS: tl.constexpr
):
    """The W4A16 GEMV's reads and nothing else: a [BLOCK_N, WORDS] tile of int32 words a step over a slice
    of each row, as gemv4.py walks them (16-byte loads), XOR-ed into one word a row (so that the loads
    stay), one store a row and slice. What it reaches is the ceiling of that pattern at that size."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.program_id(1) * words_per_split
    end = tl.minimum(start + words_per_split, row_words)
    acc = tl.zeros([BLOCK_N, WORDS], tl.int32)
    for w0 in range(start, end, WORDS):
        offs = rows[:, None] * row_words + (w0 + tl.arange(0, WORDS))[None, :]
        acc ^= tl.load(src_ptr + offs, mask=(rows < N)[:, None], other=0)  # [BLOCK_N, WORDS]
    tl.store(out_ptr + tl.program_id(1) * N + rows, tl.xor_sum(acc, axis=1), mask=rows < N)


def read_reference_calls(copies: list[tuple], block_n: int, words: int, splits: int) -> list:
    """One _read_reference_kernel launch per weight copy (bench_graphed's fns), `splits` slices a row."""
    n, row_words = copies[0][0].shape[0], copies[0][0].numel() // copies[0][0].shape[0] // 4
    per_split = triton.cdiv(triton.cdiv(row_words, splits), words) * words
    out = torch.empty(splits * n, dtype=torch.int32, device=copies[0][0].device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(row_words, per_split))

    def call(p):
        _read_reference_kernel[grid](
            p.view(torch.int32), out, n, row_words, per_split, BLOCK_N=block_n, WORDS=words
        )

    return [lambda p=p: call(p) for p, _, _ in copies]


GDN_HEADS = (16, 48, 128)  # Qwen3.5-27B's Gated DeltaNet: key heads, value heads, head dim


def gdn_case(batch: int, length: int):
    """`batch` sequences of `length` tokens through a Gated DeltaNet layer: (x [T, conv channels], q, k, v,
    g, beta, cu_seqlens, state slots, bytes the delta rule moves: state read and written, q / k / v, out)."""
    hk, hv, d = GDN_HEADS
    tokens = batch * length
    cu = torch.arange(0, tokens + 1, length, dtype=torch.int32, device=DEVICE)
    slots = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    x = randn(tokens, (2 * hk + hv) * d, device=DEVICE, dtype=torch.bfloat16)
    q, k = x[:, : hk * d].view(tokens, hk, d), x[:, hk * d : 2 * hk * d].view(tokens, hk, d)
    v = x[:, 2 * hk * d :].view(tokens, hv, d)
    g = -torch.rand(tokens, hv, device=DEVICE)
    beta = torch.rand(tokens, hv, device=DEVICE, dtype=torch.bfloat16)
    moved = batch * hv * d * d * 4 * 2 + x.numel() * 2 + tokens * hv * d * 2
    return x, q, k, v, g, beta, cu, slots, moved


def best_of_sweeps(rows: list[dict]) -> list[str]:
    """One line per swept kernel and shape: its fastest configuration (what a default should be)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r["kernel"].startswith("sweep "):
            words = r["kernel"].split()
            name = " ".join(w for w in words[1:] if "=" not in w)
            groups.setdefault((name, r["shape"]), []).append(r)
    out = ["", "fastest configuration per swept kernel:"] if groups else []
    for (name, shape), group in groups.items():
        best = min(group, key=lambda r: r["us"])
        config = " ".join(w for w in best["kernel"].split() if "=" in w)
        worst = max(r["us"] for r in group)
        out.append(f"- {name}, {shape}: {config} at {best['us']:.1f} us (slowest tried {worst:.1f} us)")
    return out


# the table's sections, in order (main's nested functions of these names); the last three are sweeps
SECTIONS = (
    "dense_ops",
    "decode_attention",
    "gated_deltanet",
    "quantized_matmul",
    "mixture_of_experts",
    "prefill_attention",
    "vision_tower",
    "decode_sweep",
    "gemv_sweep",
    "sweeps",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--no-sweeps", action="store_true", help="skip the tile / split / warp sweeps")
    ap.add_argument(
        "--sections",
        help=f"only these sections, comma-separated ({', '.join(SECTIONS)})",
    )
    ap.add_argument("--compile-only", type=int, metavar="ARCH", help="no GPU: compile for this capability")
    args = ap.parse_args()
    chosen = args.sections.split(",") if args.sections else []
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:  # before any GPU work
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; use some of {', '.join(SECTIONS)}")
    if args.compile_only:
        compile_only(args.compile_only)
    peak_bw, peak_flops, device = device_peaks()
    if not COMPILE_ONLY:
        raise_clocks()
    rows = []

    row_failures = []

    def record(kernel, shape, seconds, bytes_moved=None, flops=None):
        if _row_error:
            row_failures.append(f"{kernel}, {shape}: {_row_error.pop()}")
        row = {"kernel": kernel, "shape": shape, "us": seconds * 1e6}
        if bytes_moved is not None:
            row["GB/s"] = bytes_moved / seconds / 1e9
            row["% peak"] = 100 * bytes_moved / seconds / peak_bw
        if flops is not None:
            row["TFLOP/s"] = flops / seconds / 1e12
            row["% peak"] = 100 * flops / seconds / peak_flops
        rows.append(row)
        print(row, flush=True)

    bf = torch.bfloat16

    def dense_ops():
        for tokens in (1, 8192):
            x = randn(tokens, 5120, device=DEVICE, dtype=bf)
            w = randn(5120, device=DEVICE, dtype=bf)
            r = randn(tokens, 5120, device=DEVICE, dtype=bf)
            t = bench(lambda x=x, w=w, r=r: rmsnorm_triton.rmsnorm(x, w, 1e-6, r))
            record("rmsnorm+residual", f"[{tokens}, 5120] bf16", t, bytes_moved=x.numel() * 2 * 5)
            g = randn(tokens, 2 * 17408, device=DEVICE, dtype=bf)
            t = bench(lambda g=g: silu_mul_triton.silu_mul(g))
            record("silu_mul", f"[{tokens}, 2x17408] bf16", t, bytes_moved=g.numel() * 2 * 3 // 2)
            q = randn(tokens, 24, 256, device=DEVICE, dtype=bf)
            k = randn(tokens, 4, 256, device=DEVICE, dtype=bf)
            pos = torch.arange(tokens, device=DEVICE)
            cache = randn(262144, 64, device=DEVICE)
            t = bench(lambda q=q, k=k, pos=pos, cache=cache: rope_triton.rope(q, k, pos, cache))
            record(
                "rope",
                f"q [{tokens}, 24, 256], k [{tokens}, 4, 256], rotary 64",
                t,
                bytes_moved=(q.numel() + k.numel()) * 4,
            )
            for kv in ("bf16", "k8v4"):
                kvc = KVCache.allocate(kv, tokens // 16 + 1, 16, 4, 256, DEVICE)
                slots = torch.arange(tokens, device=DEVICE)
                t = bench(lambda k=k, kvc=kvc, slots=slots: kv_store_triton.kv_store(k, k, kvc, slots))
                written = kvc.num_bytes * tokens // (kvc.k_data.shape[0] * 16)
                record(f"kv_store {kv}", f"[{tokens}, 4, 256]", t, bytes_moved=k.numel() * 2 * 2 + written)

    def decode_attention():
        for kv in ("bf16", "fp8", "int8", "k8v4"):
            if kv == "fp8" and capability() < (8, 9):
                continue
            for context in (32768, 131072):
                q, cache, table, seq_lens = decode_case(kv, context)

                def call(q=q, c=cache, tb=table, s=seq_lens):
                    return attention.paged_attention_decode(q, c, tb, s, 0.0625)

                shape = f"B=1, ctx {context // 1024}K, 24q/4kv x 256"
                record(f"decode attention {kv}", shape, bench(call), bytes_moved=cache.num_bytes)
                # the same in a CUDA graph, as the engine decodes (the cache is past L2: one input will do)
                t = bench_graphed([call])
                record(f"decode attention {kv}, graph replay", shape, t, bytes_moved=cache.num_bytes)
        # the split combination alone (its own kernel after the split-K one): what folding it into the
        # split kernel's last arrival could save at most, launch gap aside
        splits = num_decode_splits(32768)
        partial = randn(1, 24, splits, 256, device=DEVICE)
        lse = randn(1, 24, splits, device=DEVICE)
        out = torch.empty(1, 24, 256, device=DEVICE, dtype=bf)
        t = bench(lambda: attention.combine_splits(partial, lse, out))
        moved = (partial.numel() + lse.numel()) * 4 + out.numel() * 2
        record("decode split reduction", f"B=1, {splits} splits, 24q x 256", t, bytes_moved=moved)

    def gated_deltanet():
        # Gated DeltaNet: decode reads and writes each sequence's fp32 state (48 x 128 x 128 a layer,
        # recurrent form); a 4K prefill chunk takes the chunked form
        hk, hv, d = GDN_HEADS
        channels = (2 * hk + hv) * d
        state = torch.zeros(8, hv, d, d, device=DEVICE)
        conv_state = torch.zeros(8, channels, 3, device=DEVICE, dtype=bf)
        conv_w = randn(channels, 4, device=DEVICE, dtype=bf)
        for batch, length in ((1, 1), (4, 1), (1, 4096)):
            x, q, k, v, g, beta, cu, slots, moved = gdn_case(batch, length)
            t = bench(
                lambda x=x, cu=cu, slots=slots: conv1d_triton.causal_conv1d(x, conv_w, conv_state, cu, slots)
            )
            shape = f"B={batch} x {length} tokens, {channels} channels"
            record("causal_conv1d", shape, t, bytes_moved=x.numel() * 2 * 2 + batch * channels * 3 * 2 * 2)
            t = bench(
                lambda q=q, k=k, v=v, g=g, beta=beta, cu=cu, slots=slots: gated_delta_triton.gated_delta_rule(
                    q, k, v, g, beta, state, cu, slots
                )
            )
            record(
                "gated_delta_rule",
                f"B={batch} x {length} tokens, {hk}k/{hv}v heads x {d}",
                t,
                bytes_moved=moved,
            )

    def quantized_matmul():
        # W4A16 / W6A16 / W8A16: the 27B MLP up projection shape (N = 17408 outputs, K = 5120), packed bytes
        # counted (q4.6 mixes 4- and 6-bit matrices)
        for bits in (4, 6, 8):
            qt, packed, scales, mins = up_proj(bits)
            for m in (1, 8, 16):  # 16: C4 with three draft tokens, the GEMV's largest M (GEMV_MAX_M)
                x = randn(m, 5120, device=DEVICE, dtype=bf)
                t = bench(
                    lambda x=x, p=packed, s=scales, z=mins, b=bits: quant_matmul_triton.quant_matmul(
                        x, p, s, z, b, 128
                    )
                )
                record(f"W{bits}A16 GEMV", f"M={m}, 17408x5120", t, bytes_moved=qt.nbytes + x.numel() * 2)
                if m in (1, 16):  # in a CUDA graph, as the engine decodes, over 4 copies of the weight
                    t = bench_graphed(gemv_calls(x, up_proj_copies(bits), bits))
                    record(
                        f"W{bits}A16 GEMV, graph replay",
                        f"M={m}, 17408x5120",
                        t,
                        bytes_moved=qt.nbytes + x.numel() * 2,
                    )
                if m == 1 and bits == 4 and not half2_failure():  # two codes an f16x2 FMA (gemv4h.py)
                    t = bench_graphed(gemv_calls(x, up_proj_copies(bits), bits, cuda_cores=True, half2=True))
                    name = "W4A16 GEMV on CUDA cores in f16x2, graph replay"
                    record(name, f"M={m}, 17408x5120", t, bytes_moved=qt.nbytes + x.numel() * 2)
                # the other M = 1 kernel than the default (gemv4/6/8.py on CUDA cores, or tensor cores)
                if m == 1:
                    cuda_cores = bits not in quant_matmul_triton.CUDA_CORE_GEMV_WIDTHS
                    t = bench_graphed(gemv_calls(x, up_proj_copies(bits), bits, cuda_cores=cuda_cores))
                    name = f"W{bits}A16 GEMV on {'CUDA' if cuda_cores else 'tensor'} cores, graph replay"
                    record(name, f"M={m}, 17408x5120", t, bytes_moved=qt.nbytes + x.numel() * 2)
            if bits != 6:  # groups of 32: a GGUF's Q4_0 / Q4_1 / Q4_K and Q8_0 blocks as the GPU holds them
                qt32, packed32, scales32, mins32 = up_proj(bits, 32)
                for m in (1, 16):
                    x = randn(m, 5120, device=DEVICE, dtype=bf)
                    t = bench(
                        lambda x=x, p=packed32, s=scales32, z=mins32, b=bits: (
                            quant_matmul_triton.quant_matmul(x, p, s, z, b, 32)
                        )
                    )
                    name = f"W{bits}A16 GEMV, groups of 32"
                    record(name, f"M={m}, 17408x5120", t, bytes_moved=qt32.nbytes + x.numel() * 2)
            # prefill chunks: the fused GEMM beside the weight dequantized by slices and multiplied by cuBLAS
            # (kernels/quant_matmul/dequant.py, the default from DEQUANT_MIN_M rows on)
            for m in (512, 2048):
                x = randn(m, 5120, device=DEVICE, dtype=bf)
                for dq in (False, True):
                    t = bench(
                        lambda x=x, p=packed, s=scales, z=mins, b=bits, dq=dq: (
                            quant_matmul_triton.quant_matmul(x, p, s, z, b, 128, dequant=dq)
                        ),
                        triton_kernels=not dq,  # --compile-only: the dequantize row below compiles its kernel
                    )
                    path = "dequant + cuBLAS" if dq else "fused"
                    record(f"W{bits}A16 GEMM, {path}", f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)
            # --int8-prefill: x quantized per (token, group) and the int8 tensor-core GEMM (what the engine
            # runs for such a chunk), and the GEMM alone; % peak is of the bf16 peak (int8's is twice it)
            for m in (512, 2048):
                x = randn(m, 5120, device=DEVICE, dtype=bf)
                xq = int8_act_triton.quantize_act(x, 128)
                out = torch.empty(m, 17408, device=DEVICE, dtype=bf)
                t = bench(
                    lambda x=x, p=packed, s=scales, z=mins, b=bits, o=out: int8_matmul_triton.int8_matmul(
                        *int8_act_triton.quantize_act(x, 128), p, s, z, b, 128, o
                    )
                )
                record(
                    f"W{bits}A8 GEMM, quantize + int8", f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120
                )
                t = bench(
                    lambda xq=xq, p=packed, s=scales, z=mins, b=bits, o=out: int8_matmul_triton.int8_matmul(
                        *xq, p, s, z, b, 128, o
                    )
                )
                record(f"W{bits}A8 GEMM, int8 alone", f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)
            x = randn(2048, 17408, device=DEVICE, dtype=bf)  # the down projection's input: K = 17408
            t = bench(lambda x=x: int8_act_triton.quantize_act(x, 128))
            record(
                "int8 activations (quantize_act)", "2048x17408", t, bytes_moved=x.numel() * 3 + 2048 * 136 * 8
            )
        # an NVFP4 / MXFP4 checkpoint's matrix as stored (kernels/fp4_matmul), the same shape; its codes, scale
        # bytes and row multipliers counted. M = 1: the CUDA-core GEMV (and the tensor-core tile, a knob)
        for fmt, group, e8m0 in (("NVFP4", 16, False), ("MXFP4", 32, True)):
            copies = fp4_up_proj_copies(group)
            size = sum(t.numel() * t.element_size() for t in copies[0])
            for m, cuda_cores in ((1, None), (1, False), (4, None), (16, None)):
                x = randn(m, 5120, device=DEVICE, dtype=bf)
                t = bench_graphed(
                    [
                        lambda p=p, x=x, c=cuda_cores, g=group, e=e8m0: fp4_matmul_triton.fp4_matmul(
                            x, *p, g, e, cuda_cores=c
                        )
                        for p in copies
                    ]
                )
                kind = ", tensor cores" if cuda_cores is False else ""
                record(
                    f"{fmt} GEMV{kind}, graph replay", f"M={m}, 17408x5120", t, bytes_moved=size + m * 10240
                )
            for m in (512, 2048):  # prefill chunks: dequantized slices, cuBLAS products
                x = randn(m, 5120, device=DEVICE, dtype=bf)
                t = bench(  # (--compile-only: scripts/cuda_compile_check.py compiles the dequantization)
                    lambda x=x, p=copies[0], g=group, e=e8m0: fp4_matmul_triton.fp4_matmul(x, *p, g, e),
                    triton_kernels=False,
                )
                record(f"{fmt} GEMM, dequant + cuBLAS", f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)
        # the dequantization alone: one slice of the scratch (packed codes, scales, minimums in; bf16 out)
        qt, packed, scales, mins = up_proj(4)
        rows = quant_dequant.slice_rows(17408, 5120, 2)
        w = torch.empty(rows, 5120, device=DEVICE, dtype=bf)
        t = bench(lambda: quant_dequant.dequantize_rows(packed, scales, mins, 4, 128, 0, w))
        record(
            "W4 dequantize (a scratch slice)",
            f"{rows}x5120",
            t,
            bytes_moved=qt.nbytes * rows // 17408 + w.numel() * 2,
        )
        # the same product on a dense bf16 weight (cuBLAS): the ceiling both GEMM paths are held against
        w = randn(17408, 5120, device=DEVICE, dtype=bf)
        for m in (512, 2048):
            x = randn(m, 5120, device=DEVICE, dtype=bf)
            t = bench(lambda x=x: x @ w.t(), triton_kernels=False)
            record("bf16 GEMM, dense weight (cuBLAS)", f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)

    def mixture_of_experts():
        # Qwen3-30B-A3B's sparse MLP (H 2048, I 768, 8 of 128 experts), experts packed at 4 bits: a decode
        # step streams its 8 experts' bytes (against HBM), a prompt chunk is compute (against the bf16 peak)
        hidden, inter, experts, k = 2048, 768, 128, 8
        gen = torch.Generator().manual_seed(0)

        def packed(n, kk):  # random codes: the timing does not depend on the values
            codes = torch.randint(0, 256, (experts, n, kk // 2), dtype=torch.uint8, generator=gen).to(DEVICE)
            scales = (torch.rand(experts, n, kk // 128, generator=gen) * 1e-3).half().to(DEVICE)
            return fused_moe_naive.PackedExperts(codes, scales, -8 * scales, 4, 128, kk)

        gate_up, down = packed(2 * inter, hidden), packed(hidden, inter)
        per_expert = sum(t[0].numel() * t.element_size() for e in (gate_up, down) for t in e[:3])
        for tokens in (1, 4, 2048):
            x = randn(tokens, hidden, device=DEVICE, dtype=bf)
            ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).to(DEVICE)
            weights = torch.rand(tokens, k, device=DEVICE)
            t = bench(lambda x=x, i=ids, w=weights: fused_moe_triton.fused_moe(x, gate_up, down, w, i))
            name, shape = "W4A16 fused MoE, 8 of 128 experts", f"T={tokens}, H 2048, I 768"
            if tokens <= 4:  # bandwidth: the distinct experts' packed bytes, read once at best
                record(name, shape, t, bytes_moved=min(experts, tokens * k) * per_expert)
                # as a decode step runs it (CUDA graph replay): 4 draws of experts, so that one call's
                # experts are mostly not in L2 for the next
                draws = [
                    torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).to(
                        DEVICE
                    )
                    for _ in range(4)
                ]
                fns = [
                    lambda x=x, i=i, w=weights: fused_moe_triton.fused_moe(x, gate_up, down, w, i)
                    for i in draws
                ]
                t = bench_graphed(fns)
                record(f"{name}, graph replay", shape, t, bytes_moved=min(experts, tokens * k) * per_expert)
            else:
                record(name, shape, t, flops=2 * tokens * k * 3 * hidden * inter)

        # the same experts as an NVFP4 checkpoint stores them (codes, e4m3 scales a 16, a multiplier a row)
        def nvfp4(n, kk):
            codes = torch.randint(0, 256, (experts, n, kk // 2), dtype=torch.uint8, generator=gen).to(DEVICE)
            scales = torch.full((experts, n, kk // 16), 0x38, dtype=torch.uint8, device=DEVICE)
            return fused_moe_naive.Fp4Experts(
                codes, scales, torch.full((experts, n), 1e-3, device=DEVICE), 16, False, kk
            )

        gate_up, down = nvfp4(2 * inter, hidden), nvfp4(hidden, inter)
        per_expert = sum(t[0].numel() * t.element_size() for e in (gate_up, down) for t in e[:3])
        for tokens in (1, 2048):
            x = randn(tokens, hidden, device=DEVICE, dtype=bf)
            ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).to(DEVICE)
            weights = torch.rand(tokens, k, device=DEVICE)
            t = bench(lambda x=x, i=ids, w=weights: fused_moe_triton.fused_moe(x, gate_up, down, w, i))
            name, shape = "NVFP4 fused MoE, 8 of 128 experts", f"T={tokens}, H 2048, I 768"
            if tokens == 1:
                record(name, shape, t, bytes_moved=k * per_expert)
            else:
                record(name, shape, t, flops=2 * tokens * k * 3 * hidden * inter)

    def prefill_attention():
        q, cache, table, seq_lens, cu = prefill_case()
        t = bench(lambda: attention.paged_attention(q, cache, table, seq_lens, cu, 0.0625))
        record("prefill attention bf16", "8K causal, 24q/4kv x 256", t, flops=PREFILL_FLOPS)
        # quantized caches, with and without --int8-prefill's int8 queries (integer QK products)
        for kv in ("int8", "k8v4"):
            q, cache, table, seq_lens, cu = prefill_case(kv)
            for int8q in (False, True):
                t = bench(
                    lambda q=q, c=cache, tb=table, sl=seq_lens, cu=cu, i=int8q: attention.paged_attention(
                        q, c, tb, sl, cu, 0.0625, int8_queries=i
                    )
                )
                name = f"prefill attention {kv}" + (", int8 queries" if int8q else "")
                record(name, "8K causal, 24q/4kv x 256", t, flops=PREFILL_FLOPS)

    def decode_sweep():
        """Decode attention at 32K around its defaults (graph replay): split count x key tile x pipeline
        depth x warps per KV dtype (rows named 'sweep decode ...')."""
        # 2026-12-04 (first H200 lease): bf16 at 32 splits took 38.5 us with 64-key tiles and 3 stages,
        # 45.6 with 32-key ones (now the SM 9.0 default: _decode_block_n); k8v4 46.1 us at 128 splits and
        # 64 keys against 81.7 at the default 32 splits, 32 keys. Here: the new default beside its
        # neighbours, and the 8-bit caches over 32 / 64 / 128 splits (more programs hide their dequantizing)
        decode_configs = {
            "bf16": [(32, 64, 4, 3), (32, 64, 4, 4), (48, 64, 4, 3), (32, 32, 4, 3)],
            **{
                kv: [(n, bn, 4, 3) for n in (32, 64, 128) for bn in (32, 64)]
                for kv in ("fp8", "int8", "k8v4")
            },
        }
        for kv, configs in decode_configs.items():
            if kv == "fp8" and capability() < (8, 9):
                continue
            q, cache, table, seq_lens = decode_case(kv, 32768)
            for splits, block_n, warps, stages in configs:
                t = bench_graphed(
                    [
                        lambda q=q, c=cache, tb=table, s=seq_lens, n=splits, bn=block_n, w=warps, st=stages: (
                            attention.paged_attention_decode(
                                q,
                                c,
                                tb,
                                s,
                                0.0625,
                                num_splits=n,
                                block_n=bn,
                                num_warps=w,
                                num_stages=st,
                            )
                        )
                    ]
                )
                name = f"sweep decode {kv} splits={splits} block_n={block_n} warps={warps} stages={stages}"
                record(name, "B=1, ctx 32K, 24q/4kv x 256", t, bytes_moved=cache.num_bytes)

    def gemv_sweep():
        """The 4-bit GEMV at M = 1 (graph replay over 4 weight copies): the tensor-core kernel's default
        beside the CUDA-core one (kernels/quant_matmul/gemv4.py) over tile rows, warps, pipeline depth and
        K slices; groups of 32, 6- and 8-bit weights on either kernel; the same reads with no arithmetic
        (_read_reference_kernel: the pattern's ceiling); then M = 16 (rows named 'sweep W4A16 GEMV ...')."""
        # 2026-12-04 (second H200 lease, graph replay): the tensor-core kernel's best was its SM 9.0 default
        # (256 rows, 16 slices, 4 warps) at 40.2-40.4 us, 24% of HBM; the CUDA-core kernel's first version
        # 25.3-25.7 us at 128 rows and 4 warps (now the M = 1 default), its loop waiting for each group's
        # loads. Here: its second version (198 instructions per KB, 95 registers: 5 programs an SM);
        # stages=2..4 copy the next groups' words ahead (cp.async, 1-2 groups in flight a program); 4 or 5 K
        # slices make 544 / 680 programs, about one resident wave (the default 8: 1088, a wave and a half)
        qt, _, _, _ = up_proj(4)
        x = randn(1, 5120, device=DEVICE, dtype=bf)
        copies = up_proj_copies(4)  # (4 copies of the weight: no L2 reuse from one call to the next)
        gemv_configs = [(False, 256, None, 4, 3)]
        for block_n in (128, 256):
            gemv_configs += [(True, block_n, None, w, st) for w in (4, 8) for st in (1, 2, 3, 4)]
        gemv_configs += [(True, 128, splits, 4, st) for splits in (4, 5, 16) for st in (1, 3)]
        # 64-row tiles: fewer registers, more programs an SM, so more groups in flight without cp.async
        gemv_configs += [(True, 64, None, w, st) for w in (2, 4) for st in (1, 3)]
        # prefetch: the next group's words loaded into registers a step ahead (164 registers at 128 rows
        # against 95: 3 programs an SM instead of 5, each with a group always in flight)
        gemv_configs += [(True, block_n, None, 4, "prefetch") for block_n in (64, 128)]
        # half2 (gemv4h.py): two codes an f16x2 FMA, 136 instructions per KB at 128 rows against 198;
        # at 256 rows 128 registers (4 programs an SM)
        gemv_configs += [(True, block_n, None, 4, "half2") for block_n in (64, 128, 256)]
        gemv_configs += [(True, 128, splits, 4, "half2") for splits in (5, 16)]
        for cuda_cores, block_n, splits, warps, stages in gemv_configs:
            auto = quant_matmul_triton.gemv_splits(17408, 40, block_n, x.device)
            prefetch, half2 = stages == "prefetch", stages == "half2"
            if half2 and half2_failure():
                continue
            knobs = dict(block_n=block_n, num_splits=splits or auto, num_warps=warps, prefetch=prefetch)
            knobs |= dict(half2=half2, num_stages=1 if prefetch or half2 else stages)
            t = bench_graphed(gemv_calls(x, copies, 4, cuda_cores=cuda_cores, **knobs))
            mark = "*" if (splits or auto) == auto else ""  # splits=N*: what gemv_splits picks
            name = (
                f"sweep W4A16 GEMV {'cuda_cores' if cuda_cores else 'tensor_cores'} block_n={block_n}"
                f" splits={splits or auto}{mark} warps={warps} stages={stages}"
            )
            record(name, "M=1, 17408x5120", t, bytes_moved=qt.nbytes + x.numel() * 2)
        # groups of 32 (a GGUF's Q4 blocks, q4.6's upgrade): the CUDA-core kernel (the default since it took
        # 228 instructions per KB at 256 rows, not yet timed) beside the tensor-core one
        qt32, _, _, _ = up_proj(4, 32)
        copies32 = up_proj_copies(4, group=32)
        for cuda_cores, block_n, warps in ((False, None, 4), (True, 128, 4), (True, 256, 4), (True, 512, 8)):
            t = bench_graphed(
                gemv_calls(x, copies32, 4, 32, cuda_cores=cuda_cores, block_n=block_n, num_warps=warps)
            )
            kernel = "cuda_cores" if cuda_cores else "tensor_cores"
            name = f"sweep W4A16 GEMV groups of 32 {kernel} block_n={block_n or 'default'} warps={warps}"
            record(name, "M=1, 17408x5120", t, bytes_moved=qt32.nbytes + x.numel() * 2)
        # 6-bit (q4.6's upgrade, a GGUF's Q5 blocks): the CUDA-core kernel (gemv6.py, the default since it
        # took 137 instructions per KB at 128 rows, not yet timed) beside the tensor-core one (12% of HBM)
        qt6, _, _, _ = up_proj(6)
        copies6 = up_proj_copies(6)
        for cuda_cores, block_n, warps in ((False, None, 4), (True, 64, 4), (True, 128, 4), (True, 256, 8)):
            t = bench_graphed(
                gemv_calls(x, copies6, 6, cuda_cores=cuda_cores, block_n=block_n, num_warps=warps)
            )
            kernel = "cuda_cores" if cuda_cores else "tensor_cores"
            name = f"sweep W6A16 GEMV {kernel} block_n={block_n or 'default'} warps={warps}"
            record(name, "M=1, 17408x5120", t, bytes_moved=qt6.nbytes + x.numel() * 2)
        # 8-bit (w8g128, a GGUF's Q8_0 blocks in groups of 32): the CUDA-core kernel (gemv8.py, a knob: 124
        # instructions per KB at 64 rows against the tensor-core kernel's 123, which measured 59% of HBM)
        for group in (128, 32):
            qt8, _, _, _ = up_proj(8, group)
            copies8 = up_proj_copies(8, group=group)
            rows = (64, 128) if group == 128 else (128, 256)
            for cuda_cores, block_n in ((False, None),) + tuple((True, b) for b in rows):
                t = bench_graphed(gemv_calls(x, copies8, 8, group, cuda_cores=cuda_cores, block_n=block_n))
                kernel = "cuda_cores" if cuda_cores else "tensor_cores"
                name = f"sweep W8A16 GEMV groups of {group} {kernel} block_n={block_n or 'default'}"
                record(name, "M=1, 17408x5120", t, bytes_moved=qt8.nbytes + x.numel() * 2)
        # the same reads alone (no arithmetic): the ceiling of the 4-bit GEMV's access pattern at 44.6 MB,
        # a step's tile one group (16 words) or four, in 2, 5 or 8 slices a row (the GEMV's default: 8)
        for block_n, words, splits in ((128, 16, 8), (128, 16, 5), (128, 64, 5), (256, 64, 2)):
            t = bench_graphed(read_reference_calls(copies, block_n, words, splits))
            name = f"sweep W4A16 GEMV reads only block_n={block_n} words={words} splits={splits}"
            record(name, "M=1, 17408x5120", t, bytes_moved=qt.nbytes)
        x16 = randn(16, 5120, device=DEVICE, dtype=bf)
        for block_n in (128, 256):
            t = bench_graphed(gemv_calls(x16, copies, 4, block_n=block_n))
            name = f"sweep W4A16 GEMV M=16 block_n={block_n}"
            record(name, "M=16, 17408x5120", t, bytes_moved=qt.nbytes + x16.numel() * 2)
        # 2 and 4 activation rows (C2 / C4 decode, speculative verification): the tensor-core GEMV (its
        # 16-row tile padded) beside gemv4h.py's rows in one program (a knob: half2=True; 197 / 320
        # instructions per KB at 128 rows, SM 9.0, 128 / 254 registers)
        for m in (2, 4):
            xm = randn(m, 5120, device=DEVICE, dtype=bf)
            for half2, block_n in ((False, None), (True, 64), (True, 128)):
                if half2 and half2_failure():
                    continue
                t = bench_graphed(gemv_calls(xm, copies, 4, half2=half2, block_n=block_n))
                kernel = "cuda_cores half2" if half2 else "tensor_cores"
                name = f"sweep W4A16 GEMV M={m} {kernel} block_n={block_n or 'default'}"
                record(name, f"M={m}, 17408x5120", t, bytes_moved=qt.nbytes + xm.numel() * 2)

    def sweeps():
        """Tile, split and warp choices around the defaults of the GEMM, prefill attention and Gated
        DeltaNet kernels (rows named 'sweep ...'; decode_sweep and gemv_sweep are their own sections)."""
        _, packed, scales, mins = up_proj(4)
        x = randn(2048, 5120, device=DEVICE, dtype=bf)  # a prefill chunk through the up projection
        for block_m, block_n, warps in ((32, 64, 4), (64, 64, 8), (64, 128, 8), (128, 64, 8), (128, 128, 8)):
            t = bench(
                lambda bm=block_m, bn=block_n, w=warps: quant_matmul_triton.quant_matmul(
                    x, packed, scales, mins, 4, 128, block_m=bm, block_n=bn, num_warps=w, dequant=False
                )
            )
            name = f"sweep W4A16 GEMM block_m={block_m} block_n={block_n} warps={warps}"
            record(name, "M=2048, 17408x5120", t, flops=2 * 2048 * 17408 * 5120)
        # where dequantizing by slices for cuBLAS overtakes the fused GEMM: the crossover DEQUANT_MIN_M sets
        for m in (64, 128, 256, 512, 1024):
            x = randn(m, 5120, device=DEVICE, dtype=bf)
            for dq in (False, True):
                t = bench(
                    lambda x=x, dq=dq: quant_matmul_triton.quant_matmul(
                        x, packed, scales, mins, 4, 128, dequant=dq
                    ),
                    triton_kernels=not dq,
                )
                path = "dequant" if dq else "fused"
                record(f"sweep W4A16 GEMM path={path}", f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)
                # the device time alone (graph replay: no host launch in it), the same two paths, cycling
                # through 4 copies of the weight as do_bench's cleared L2 would have it
                t = bench_graphed(gemv_calls(x, up_proj_copies(4), 4, dequant=dq), calls=8)
                name = f"sweep W4A16 GEMM graph replay path={path}"
                record(name, f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)
        # the scratch's size: smaller slices may stay in L2 between their dequantization and cuBLAS reading
        # them back, larger ones give cuBLAS wider products (fewer partial waves); 64 MiB is the default
        default_scratch = quant_dequant.DEQUANT_SCRATCH_BYTES
        try:
            for m in (512, 2048):
                x = randn(m, 5120, device=DEVICE, dtype=bf)
                for mib in (16, 32, 64, 128):
                    quant_dequant.DEQUANT_SCRATCH_BYTES = mib << 20
                    t = bench(
                        lambda x=x: quant_matmul_triton.quant_matmul(
                            x, packed, scales, mins, 4, 128, dequant=True
                        ),
                        triton_kernels=False,
                    )
                    name = f"sweep W4A16 GEMM dequant scratch_mib={mib}"
                    record(name, f"M={m}, 17408x5120", t, flops=2 * m * 17408 * 5120)
        finally:
            quant_dequant.DEQUANT_SCRATCH_BYTES = default_scratch
        # the int8 prefill GEMM's tiles (defaults 128 x 64, 8 warps, 3 stages: the fewest loop instructions
        # without spills in scripts/cuda_compile_check.py) for 4- and 6-bit weights
        for bits in (4, 6):
            weight = up_proj(bits)[1:]  # packed, scales, minimums
            x = randn(2048, 5120, device=DEVICE, dtype=bf)
            xq = int8_act_triton.quantize_act(x, 128)
            out = torch.empty(2048, 17408, device=DEVICE, dtype=bf)
            for block_m, block_n, warps, stages in (
                (128, 64, 8, 3),
                (128, 64, 8, 4),
                (64, 64, 4, 3),
                (64, 128, 4, 3),
                (128, 128, 8, 3),
                (64, 256, 8, 3),
            ):
                t = bench(
                    lambda bm=block_m, bn=block_n, w=warps, st=stages, xq=xq, wt=weight, b=bits, o=out: (
                        int8_matmul_triton.int8_matmul(
                            *xq,
                            *wt,
                            b,
                            128,
                            o,
                            block_m=bm,
                            block_n=bn,
                            num_warps=w,
                            num_stages=st,
                        )
                    )
                )
                name = (
                    f"sweep W{bits}A8 GEMM block_m={block_m} block_n={block_n} warps={warps} stages={stages}"
                )
                record(name, "M=2048, 17408x5120", t, flops=2 * 2048 * 17408 * 5120)
        q, cache, table, seq_lens, cu = prefill_case()
        for block_m in (32, 64, 128):
            for block_n in (32, 64):
                for warps in (4, 8):
                    t = bench(
                        lambda bm=block_m, bn=block_n, w=warps: attention.paged_attention(
                            q, cache, table, seq_lens, cu, 0.0625, block_m=bm, block_n=bn, num_warps=w
                        )
                    )
                    name = f"sweep prefill bf16 block_m={block_m} block_n={block_n} warps={warps}"
                    record(name, "8K causal, 24q/4kv x 256", t, flops=PREFILL_FLOPS)
        _, hv, d = GDN_HEADS
        state = torch.zeros(4, hv, d, d, device=DEVICE)
        for batch, length in ((1, 1), (1, 1024), (1, 4096)):
            _, q, k, v, g, beta, cu, slots, moved = gdn_case(batch, length)
            # the recurrent form (decode, and 1K tokens to place the crossover); the chunked form (prefill)
            # and the chunked scan with two pipeline stages (stages=2) beside its default
            configs = (
                [(False, bv, w, None) for bv in (8, 16, 32) for w in (1, 2, 4)] if length <= 1024 else []
            )
            configs += [(True, bv, w, None) for bv in (16, 32, 64) for w in (4, 8)] if length > 1 else []
            configs += [(True, 32, 8, 2)] if length > 1 else []
            for chunked, block_v, warps, stages in configs:
                t = bench(
                    lambda q=q, k=k, v=v, g=g, b=beta, cu=cu, s=slots, c=chunked, bv=block_v, w=warps, st=stages: (
                        gated_delta_triton.gated_delta_rule(
                            q, k, v, g, b, state, cu, s, chunked=c, block_v=bv, num_warps=w, num_stages=st
                        )
                    )
                )
                form = "chunked" if chunked else "recurrent"
                name = f"sweep gated_delta_rule {form} block_v={block_v} warps={warps}"
                record(
                    name + (f" stages={stages}" if stages else ""),
                    f"B={batch} x {length} tokens",
                    t,
                    bytes_moved=moved,
                )

    def vision_tower():
        """Qwen3.5's tower (27 blocks, 1152 wide, 16 heads) encoding one screenshot, bf16: what an image
        adds to the time to first token. Torch ops (cuBLAS, SDPA); --compile-only runs a 1-block tower on
        the CPU once, untimed."""
        depth = 1 if COMPILE_ONLY else 27
        config = VisionConfig(
            depth=depth, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=5120
        )
        with torch.device(DEVICE):
            tower = VisionTower(config).to(bf)
        for p in tower.parameters():
            p.data.normal_(0, 0.02)
        h, i = config.hidden_size, config.intermediate_size
        for side in (1024, 2048) if not COMPILE_ONLY else (64,):
            grid = (1, side // 16, side // 16)
            n = grid[1] * grid[2]
            pixels = randn(n, config.patch_dim, device=DEVICE)
            if COMPILE_ONLY:
                tower(pixels, grid)
                continue
            flops = depth * (2 * n * h * 4 * h + 4 * n * h * i + 4 * n * n * h) + 2 * n * config.patch_dim * h
            flops += 2 * (n // 4) * (4 * h) * (4 * h + config.out_hidden_size)
            t = bench(lambda p=pixels, g=grid: tower(p, g), triton_kernels=False)
            record(
                "vision tower", f"{side}x{side} image: {n} patches -> {n // 4} tokens, bf16", t, flops=flops
            )

    failed = []
    sections = (
        dense_ops,
        decode_attention,
        gated_deltanet,
        quantized_matmul,
        mixture_of_experts,
        prefill_attention,
        vision_tower,
        decode_sweep,
        gemv_sweep,
        sweeps,
    )
    assert tuple(f.__name__ for f in sections) == SECTIONS
    if chosen:
        sections = tuple(f for f in sections if f.__name__ in chosen)
    elif args.no_sweeps:
        sections = sections[:-3]  # decode_sweep, gemv_sweep, sweeps
    for section in sections:
        try:  # one section's failure (a kernel that does not compile here) costs its rows, not the table
            section()
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{section.__name__}: {type(exc).__name__}: {exc}".splitlines()[0])
            print("FAILED", failed[-1], flush=True)

    failed += row_failures + [f"{k} on SM {COMPILE_ONLY}" for k in sorted(set(_too_big))]
    if half2_failure.cache_info().currsize and half2_failure():  # (checked where a section wanted it)
        failed.append(half2_failure())
    lines = [
        f"device: {device}; peaks: {peak_bw / 1e9:.0f} GB/s, {peak_flops / 1e12:.0f} TFLOP/s bf16",
        "",
        "| kernel | shape | µs | GB/s | TFLOP/s | % peak |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['shape']} | {r['us']:.1f} | {r.get('GB/s', float('nan')):.0f} | "
            f"{r.get('TFLOP/s', float('nan')):.1f} | {r.get('% peak', float('nan')):.0f} |"
        )
    lines += [] if COMPILE_ONLY else best_of_sweeps(rows)
    lines += [f"\nFAILED {f}" for f in failed]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": rows, "failed": failed}, f, indent=1)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
