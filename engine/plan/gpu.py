"""The local GPU as `ninfer plan` sees it, through NVML (pynvml, the nvidia-ml-py distribution)."""

from __future__ import annotations

from engine.errors import NinferError
from engine.plan.solver import Device


def local_gpu(index: int = 0) -> Device:
    """Name, total memory and compute capability of GPU `index`; NinferError asking for --vram without one."""
    try:
        pynvml = _nvml()
    except Exception as e:  # no driver, no library: the same answer for the user
        raise NinferError(
            f"no GPU found here (NVML: {e}); pass the card's memory, e.g. --vram 24G --sm 86"
        ) from e
    try:
        if pynvml.nvmlDeviceGetCount() <= index:
            raise NinferError(
                "no GPU found here (NVML sees none); pass the card's memory, e.g. --vram 24G --sm 86"
            )
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return Device(name, int(total), (int(major), int(minor)))
    finally:
        pynvml.nvmlShutdown()


def _nvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def parse_sm(text: str) -> tuple[int, int]:
    """86, 8.6 or sm_86 -> (8, 6)."""
    t = text.lower().removeprefix("sm_").removeprefix("sm")
    if "." in t:
        major, _, minor = t.partition(".")
    else:
        major, minor = t[:-1], t[-1:]
    if not (major.isdigit() and minor.isdigit()):
        raise NinferError(f"--sm '{text}' is not a compute capability; write e.g. 86, 8.9 or 90")
    return int(major), int(minor)
