"""Sleep: the engine's device memory given back while it idles, taken again when a request comes.

Every device tensor the model runner reaches (weights, KV pages, recurrent states, LoRA adapters, the
drafter's buffers) is found by walking its objects; each distinct storage is copied to host memory and
resized to nothing, which frees its device memory while every tensor and view over it stays a valid
object. Waking resizes each storage back and copies its bytes in: the tensors are the same objects, at
new addresses, so the CUDA graphs (which hold addresses) are dropped before sleeping and captured again
after waking. Storages marked `discard` (the KV pool and recurrent states at level 2) are not copied:
they come back zeroed. A tensor the walk does not reach, or one marked `shared` (the rotary tables every
model of the process reads), keeps its memory and its bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import psutil
import torch

from engine.errors import DeviceMemoryBusy, NinferError
from engine.sizes import format_bytes
from engine.worker.host_kv import HOST_MARGIN

_OURS = ("engine.", "ninfer_kernels.")


def device_tensors(
    roots: Iterable[object], device: torch.device, skip: Iterable[object] = ()
) -> Iterator[torch.Tensor]:
    """Each tensor on `device` reachable from `roots` through modules, the project's own objects, and the
    dicts, lists and tuples they hold (once each); nothing reached only through `skip`'s objects."""
    seen: set[int] = {id(obj) for obj in skip}
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type == device.type:
                yield obj
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, torch.nn.Module) or type(obj).__module__.startswith(_OURS):
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            for name in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, name, None))


def host_memory_free() -> int:
    """Host memory the system can give now, the 2 GiB kept for it taken off."""
    return max(0, psutil.virtual_memory().available - HOST_MARGIN)


class _Held(NamedTuple):
    storage: torch.UntypedStorage
    nbytes: int
    keep: bool  # False: not copied, zeroed on waking


def _bytes_of(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """[nbytes] uint8 over the storage's memory."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


class DeviceMemory:
    """The storages of the tensors reachable from `roots`, freed by `release` and taken back by `restore`."""

    def __init__(
        self,
        roots: Iterable[object],
        device: torch.device,
        discard: Iterable[torch.Tensor] = (),
        shared: Iterable[torch.Tensor] = (),
        pin: bool = False,
        skip: Iterable[object] = (),
    ):
        """discard: tensors whose bytes are not kept; shared: tensors others hold too, left as they are; skip:
        objects not walked into (the CUDA graphs, dropped rather than held); pin:
        the host copies in page-locked memory (CUDA). NOTE: off in the engine until measured: torch's pinned
        allocator rounds each buffer up to a power of two (up to twice the host memory the check counted);
        benchmarks/sleep_wake.py times both."""
        self.device = device
        self.pin = pin and device.type == "cuda"
        dropped = {t.untyped_storage().data_ptr() for t in discard}
        leave = {t.untyped_storage().data_ptr() for t in shared}
        found: dict[int, _Held] = {}
        for t in device_tensors(roots, device, skip):
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            # NOTE: a storage that cannot be resized (memory-mapped weights on CPU) keeps its memory
            if storage.nbytes() and storage.resizable() and ptr not in found and ptr not in leave:
                found[ptr] = _Held(storage, storage.nbytes(), ptr not in dropped)
        self._storages = list(found.values())
        self._host: list[torch.Tensor | None] = []  # [nbytes] uint8 per kept storage while released

    @property
    def host_bytes(self) -> int:
        """Host memory `release` takes: the bytes it keeps."""
        return sum(h.nbytes for h in self._storages if h.keep)

    @property
    def device_bytes(self) -> int:
        return sum(h.nbytes for h in self._storages)

    def check_host_memory(self, what: str) -> None:
        free = host_memory_free()
        if self.host_bytes > free:
            raise NinferError(
                f"{what} needs {format_bytes(self.host_bytes)} of host memory to hold the device's bytes and "
                f"{format_bytes(free)} are free (2 GiB kept for the system)"
            )

    def _host_buffer(self, nbytes: int) -> torch.Tensor:
        """[nbytes] uint8 in host memory: page-locked when pinning, pageable where the system refuses more."""
        if self.pin:
            try:
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:
                self.pin = False
        return torch.empty(nbytes, dtype=torch.uint8)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Copy the kept storages to host memory, then free every storage's device memory; refused in a
        sentence, nothing freed, when the host cannot give the memory after all."""
        host = []
        try:
            for h in self._storages:
                buffer = self._host_buffer(h.nbytes) if h.keep else None
                if buffer is not None:
                    buffer.copy_(_bytes_of(h.storage, self.device), non_blocking=buffer.is_pinned())
                host.append(buffer)
            self._sync()
        except RuntimeError as e:
            # the host allocator refused (the check saw more memory free than there was)
            del host
            raise NinferError(
                f"sleeping could not take {format_bytes(self.host_bytes)} of host memory "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); free host memory and try again"
            ) from None
        for h in self._storages:  # freed only once every copy is made: a failed copy frees nothing
            h.storage.resize_(0)
        self._host = host
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def drop(self, tensors: Iterable[torch.Tensor]) -> int:
        """While released: stop holding these tensors' bytes (they come back zeroed, as discarded ones do);
        the host bytes let go."""
        # (a released storage is resized to nothing: it is named by its StorageImpl, not its memory)
        impls = {t.untyped_storage()._cdata for t in tensors}
        freed = 0
        for i, h in enumerate(self._storages):
            if h.keep and h.storage._cdata in impls:
                self._storages[i] = h._replace(keep=False)
                freed += h.nbytes
                if i < len(self._host):
                    self._host[i] = None
        return freed

    def restore(self) -> None:
        """Device memory for every storage again, holding its bytes (zeros for the discarded ones). When the
        device cannot give it (another process took the memory), what was taken is freed again and the
        host copies are kept, so a later call can try again."""
        try:
            for h, host in zip(self._storages, self._host):
                h.storage.resize_(h.nbytes)
                target = _bytes_of(h.storage, self.device)
                if host is None:
                    target.zero_()
                else:
                    target.copy_(host, non_blocking=host.is_pinned())
            self._sync()
        except torch.OutOfMemoryError:
            self._sync()  # the copies under way land before their memory goes
            for h in self._storages:
                h.storage.resize_(0)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 0
            raise DeviceMemoryBusy(
                f"waking up needs {format_bytes(self.device_bytes)} of device memory and {format_bytes(free)} "
                "are free; stop what took it, then send the request again"
            ) from None
        pinned = any(host is not None and host.is_pinned() for host in self._host)
        self._host = []
        if pinned and hasattr(torch._C, "_host_emptyCache"):  # page-locked memory back to the system
            torch._C._host_emptyCache()
