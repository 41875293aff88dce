"""What the Triton wrappers choose by where a kernel runs: compiled for a GPU, or under the interpreter.

The choice follows the interpreter, not the tensors' device, so a kernel compiled ahead of time from CPU
tensors (scripts/cuda_compile_check.py) is the one a GPU compiles.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

_HALF_DOT_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (TRITON_INTERPRET=1)."""
    knobs = getattr(triton, "knobs", None)  # Triton >= 3.4; older ones read the environment
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    """input_precision of tl.dot: exact fp32 products for fp32 inputs and under the interpreter, tensor-core
    (tf32) products for half-precision inputs on a GPU."""
    return "ieee" if dtype == torch.float32 or interpreting() else "tf32"


def dot_dtype(dtype: torch.dtype):
    """Operand dtype of tl.dot: the model's half dtype on a GPU; fp32 for fp32 models and under the
    interpreter (its half-precision arithmetic is unreliable)."""
    return tl.float32 if interpreting() else _HALF_DOT_DTYPES.get(dtype, tl.float32)


# the most shared memory one block may use (opt-in), bytes, by compute capability (vendor figures)
SHARED_MEMORY_PER_BLOCK = {
    80: 166912,
    86: 101376,
    87: 166912,
    89: 101376,
    90: 232448,
    100: 232448,
    120: 101376,
}
_SMALLEST_SHARED_MEMORY = min(SHARED_MEMORY_PER_BLOCK.values())


def shared_memory_per_block(device: torch.device) -> int:
    """Shared memory one block may use where the kernels for tensors on `device` compile: the GPU's own
    figure; for CPU tensors compiled ahead of time (scripts/cuda_compile_check.py), the table's for the
    active driver's target; under the interpreter, where nothing compiles, the smallest."""
    if device.type == "cuda" and not interpreting():
        return _gpu_shared_memory(device)
    return SHARED_MEMORY_PER_BLOCK.get(compute_capability(device), _SMALLEST_SHARED_MEMORY)


def compute_capability(device: torch.device) -> int:
    """Where the kernels for tensors on `device` compile, as 10 * major + minor: the GPU's own; for CPU tensors
    compiled ahead of time (scripts/cuda_compile_check.py), the active driver's target; 0 under the
    interpreter, where nothing compiles."""
    if interpreting():
        return 0
    if device.type == "cuda":
        return _gpu_capability(device)
    from triton.runtime import driver

    return driver.active.get_current_target().arch


@functools.cache
def _gpu_capability(device: torch.device) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU `device` is on; for CPU tensors (the compile check, the
    interpreter) an H100's / H200's 132, what grids are sized for there."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def pipeline_stages(three_stage_bytes: int, device: torch.device) -> int:
    """Software-pipeline depth of a kernel's main loop: three stages (the next two tiles' copies in flight
    while one is computed) where the target's shared memory holds them (three_stage_bytes: the kernel's
    own estimate), else two."""
    return 3 if three_stage_bytes <= shared_memory_per_block(device) else 2


@functools.cache
def _gpu_shared_memory(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    optin = getattr(props, "shared_memory_per_block_optin", 0)  # not in every torch
    return optin or SHARED_MEMORY_PER_BLOCK.get(_gpu_capability(device), _SMALLEST_SHARED_MEMORY)
