"""Build and load the CPU ops written in C (`kernels/<op>/native.c`), compiled together into one shared
library with the system C compiler, once per machine, and cached on disk.

Why C on the CPU: a decode step of a small model is ~40 tiny ops a layer, and each torch call costs a few
microseconds of dispatch before any arithmetic (a 576-wide RMSNorm: ~17 us in five torch calls, ~5 us as
one C call through ctypes); and torch's int4 CPU matmul runs at a fifth of what VNNI dot products reach.

The library is built with -march=native, so the cache key holds the sources, the compiler's version and
this CPU's feature flags: a home directory shared between machines never loads another CPU's build. Where
no compiler is found, the build fails, or NINFER_CPU_KERNELS=torch, `library()` is None and
`unavailable_reason()` says why: every op then runs its naive torch twin. The int4 matmul needs AVX-512
VNNI or AVX2 besides (`has_q4()`); the other ops are plain C.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("ninfer")

KERNELS_DIR = Path(__file__).parent
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fno-math-errno", "-shared", "-fPIC")
LIBS = ("-lm", "-lpthread")
CHOICES = ("native", "torch")
POOLS = ("openmp", "helper")
Q4_ABI_VERSION = 1

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# symbol -> argument types (every function returns int: 0, or a negative error code)
SIGNATURES = {
    "ninfer_q4_matmul": [_P, _P, _P, _I, _I, _I],
    "ninfer_q4_dequantize_t_bf16": [_P, _P, _I, _I],
    "ninfer_rmsnorm": [_P, _P, _P, _P, _P, _I, _I, _I, _F, _I],
    "ninfer_rmsnorm_gated": [_P] * 4 + [_I] * 4 + [_F],
    "ninfer_silu_mul": [_P, _P, _I, _I, _I],
    "ninfer_rope": [_P] * 6 + [_I] * 8,
    "ninfer_kv_store": [_P] * 7 + [_I] * 7,
    "ninfer_decode_attention": [_P] * 9 + [_I] * 9 + [_F],
    "ninfer_gated_delta_rule": [_P] * 9 + [_I] * 11,
    "ninfer_causal_conv1d": [_P] * 6 + [_I] * 7,
    "ninfer_race_noise": [_P, _P, _I, _I],
}

# kv_dtype -> the mode number kv_store and decode attention take (the enum in native_math.h; fp8 has none)
KV_MODES = {"fp32": 0, "bf16": 1, "fp16": 2, "int8": 3, "k8v4": 4}

_state: dict[str, object] = {}


def sources() -> list[Path]:
    return sorted(KERNELS_DIR.glob("*/native.c")) + [KERNELS_DIR / "native_pool.c"]


def headers() -> list[Path]:
    return sorted(KERNELS_DIR.glob("*.h"))


def cache_dir() -> Path:
    """$NINFER_HOME (as for fetched models), else ~/.cache/ninfer."""
    return Path(os.environ.get("NINFER_HOME", Path.home() / ".cache" / "ninfer"))


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    parts = [p.read_text() for p in sources() + headers()] + [
        version,
        " ".join(FLAGS),
        _cpu_flags(),
        platform.machine(),
    ]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    target = cache_dir() / "native" / f"ninfer-cpu-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # built beside the target and renamed into place: concurrent processes never load a half-written file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [cc, *FLAGS, *map(str, sources()), "-o", tmp, *LIBS]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{Path(cc).name} failed: {last}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load() -> ctypes.CDLL | None:
    choice = os.environ.get("NINFER_CPU_KERNELS", "native")
    if choice not in CHOICES:
        raise ValueError(f"NINFER_CPU_KERNELS={choice} is not one of {', '.join(CHOICES)}")
    if choice == "torch":
        _state["reason"] = "NINFER_CPU_KERNELS=torch"
        return None
    if platform.system() != "Linux":
        _state["reason"] = f"native CPU kernels are built on Linux, not {platform.system()}"
        return None
    cc = _compiler()
    if cc is None:
        _state["reason"] = "no C compiler found (set CC, or install gcc)"
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _state["reason"] = f"building the native CPU kernels failed ({e})"
        return None
    bind(lib)
    _state["q4"] = lib.ninfer_q4_abi() == Q4_ABI_VERSION
    _state["pool"] = set_pool(lib, os.environ.get("NINFER_CPU_POOL", "openmp"))
    return lib


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the library's function signatures."""
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, argtypes
    lib.ninfer_q4_abi.restype = ctypes.c_int
    lib.ninfer_pool_use_openmp.restype = ctypes.c_int
    lib.ninfer_pool_use_openmp.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    return lib


def _openmp_parallel() -> int | None:
    """The address of libgomp's GOMP_parallel where torch has loaded libgomp (its x86 Linux wheels ship it);
    None under another OpenMP runtime or none."""
    try:
        fn = ctypes.CDLL(None).GOMP_parallel
    except AttributeError:
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def set_pool(lib: ctypes.CDLL, pool: str) -> str:
    """Where the ops' parallel work runs: "openmp", torch's OpenMP team (where torch runs on libgomp and
    has two threads or more), or "helper", a thread of the library's own; returns the one chosen. Two
    pools on the same cores fight (see native_pool.c), so "openmp" is the default (NINFER_CPU_POOL)."""
    if pool not in POOLS:
        raise ValueError(f"NINFER_CPU_POOL={pool} is not one of {', '.join(POOLS)}")
    parallel, threads = _openmp_parallel(), torch.get_num_threads()
    if pool == "openmp" and parallel is not None and threads >= 2:
        check(lib.ninfer_pool_use_openmp(parallel, threads), "pool")
        return "openmp"
    check(lib.ninfer_pool_use_openmp(None, 0), "pool")
    return "helper"


def pool() -> str | None:
    """The worker pool of the loaded library (see set_pool); None where it is not loaded."""
    library()
    return _state.get("pool")  # type: ignore[return-value]


def library() -> ctypes.CDLL | None:
    """The loaded library, built on first call; None where unavailable (see unavailable_reason)."""
    if "lib" not in _state:
        _state["lib"] = _load()
        if _state["lib"] is None:
            log.info("native CPU kernels unavailable: %s; running the torch ops", _state["reason"])
    return _state["lib"]  # type: ignore[return-value]


def has_q4() -> bool:
    """Whether the int4 matmul is built: it needs AVX-512 VNNI (and F16C, AVX-512 BW), or AVX2 (and FMA,
    F16C)."""
    return library() is not None and bool(_state.get("q4"))


def unavailable_reason() -> str | None:
    """Why the library is not loaded; None where it is (then has_q4() says whether the int4 matmul is)."""
    library()
    return _state.get("reason")  # type: ignore[return-value]


def heads_packed(x) -> bool:
    """fp32 [T, H, D] whose heads are D floats apart and tokens any stride apart (views into a fused qkv
    output are): the layout the C ops read."""
    return x.dtype == torch.float32 and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def cache_readable(cache) -> bool:
    """A KVCache as the C ops index it: data and scales contiguous (as allocated), scales fp16."""
    ks, vs, f16 = cache.k_scale, cache.v_scale, torch.float16  # written out: runs twice a layer a step
    k_ok = ks is None or (ks.dtype == f16 and ks.is_contiguous())
    v_ok = vs is None or (vs.dtype == f16 and vs.is_contiguous())
    return k_ok and v_ok and cache.k_data.is_contiguous() and cache.v_data.is_contiguous()


def check(rc: int, op: str) -> None:
    """Turn a native op's error code into an exception (codes listed in each native.c)."""
    if rc == -1:
        raise MemoryError(f"the native {op} op could not allocate its scratch memory")
    if rc != 0:
        raise ValueError(f"the native {op} op refused its arguments (code {rc}): an index is out of range")


def reset() -> None:
    """Forget the loaded library (tests that change NINFER_CPU_KERNELS)."""
    _state.clear()
