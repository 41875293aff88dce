"""The host tier's storage (engine/cache/host_pool.py): for every tensor of every attention layer's paged
cache ([num_blocks, block_size, ...]: data and, for quantized KV dtypes, scales), a host tensor of the same
page shape with one row a host slot; likewise, for a hybrid model's state snapshots
(engine/cache/state_pool.py), one for each recurrent-state tensor ([slots, ...]: conv and delta-rule state
of every linear-attention layer). Pinned on CUDA, so the copies run asynchronously in stream order (no host
sync: the step's swap-outs, then its swap-ins, then its forward)."""

from __future__ import annotations

import psutil
import torch

from engine.cache.kv_layout import KVCache
from engine.cache.state_pool import HOST_SNAPSHOTS_PER_SLOT
from engine.errors import NinferError

HOST_MARGIN = 2 << 30  # host memory the tier leaves to the system and the server itself


def page_tensors(caches: list[KVCache]) -> list[torch.Tensor]:
    return [t for c in caches for t in (c.k_data, c.v_data, c.k_scale, c.v_scale) if t is not None]


def page_bytes(caches: list[KVCache]) -> int:
    """Bytes one KV page holds across every attention layer (what a host slot stores)."""
    return row_bytes(page_tensors(caches))


def check_host_memory(host_cache: int) -> None:
    """Refused in a sentence when `host_cache` bytes of host memory are not free (checked before the model
    loads, and again when the tier is allocated)."""
    free = psutil.virtual_memory().available
    if host_cache > free - HOST_MARGIN:
        fits = max(0, free - HOST_MARGIN)
        raise NinferError(
            f"--host-cache {host_cache / 2**30:.1f} GiB is more than the {free / 2**30:.1f} GiB of host memory "
            f"free (2 GiB kept for the system); use --host-cache {fits / 2**30:.1f}G or less"
        )


def host_state_slots(
    host_cache: int, host_state_snapshots: int | None, gpu_snapshots: int, state_slot: int
) -> int:
    """How many state snapshots the host tier holds (engine/cache/state_pool.py): `host_state_snapshots`,
    or by default an eighth of `host_cache` (taken from it), or without one HOST_SNAPSHOTS_PER_SLOT times
    the `gpu_snapshots` slots (as host memory free allows); 0 without recurrent state (`state_slot` bytes) or GPU
    snapshot slots to evict from. Refused in a sentence when the count asked for does not fit."""
    if not state_slot or not gpu_snapshots:
        return 0
    if host_state_snapshots is None:
        if host_cache:
            return host_cache // 8 // state_slot
        spare = max(0, psutil.virtual_memory().available - HOST_MARGIN) // 2  # half: the rest is the system's
        return min(HOST_SNAPSHOTS_PER_SLOT * gpu_snapshots, spare // state_slot)
    need = host_state_snapshots * state_slot
    if host_cache and need >= host_cache:
        raise NinferError(
            f"--host-state-snapshots {host_state_snapshots} take {need / 2**30:.2f} GiB ({state_slot / 2**20:.1f} "
            f"MiB each), all of --host-cache {host_cache / 2**30:.2f} GiB, leaving no KV page; give at most "
            f"{max(0, (host_cache - 1) // state_slot)} or a larger --host-cache"
        )
    free = psutil.virtual_memory().available - HOST_MARGIN
    if not host_cache and need > free:
        raise NinferError(
            f"--host-state-snapshots {host_state_snapshots} take {need / 2**30:.1f} GiB of host memory "
            f"({state_slot / 2**20:.1f} MiB each), more than the {max(0, free) / 2**30:.1f} GiB free (2 GiB kept "
            f"for the system); give at most {max(0, free) // state_slot}"
        )
    return host_state_snapshots


def host_slots_for(host_cache: int, page: int) -> int:
    """How many KV pages `host_cache` bytes of host memory hold; refused in a sentence when the memory is
    not free or holds no page."""
    check_host_memory(host_cache)
    slots = host_cache // page
    if slots == 0:
        raise NinferError(f"--host-cache {host_cache} B holds no KV page ({page} B each); give at least that")
    return slots


def row_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes one row (a page, a state slot) holds across `tensors`."""
    return sum(t[0].numel() * t.element_size() for t in tensors)


class HostTier:
    """Host rows mirroring device tensors' rows: `pairs` (device tensor, host tensor [num_slots, ...])."""

    def __init__(self, tensors: list[torch.Tensor], num_slots: int, device: torch.device, flag: str):
        pin = device.type == "cuda"
        try:
            self.pairs = [
                (t, torch.empty((num_slots, *t.shape[1:]), dtype=t.dtype, pin_memory=pin)) for t in tensors
            ]
        except RuntimeError as e:  # the driver could not pin (lock) that much host memory
            raise NinferError(
                f"could not {'pin' if pin else 'allocate'} {num_slots * row_bytes(tensors) / 2**30:.1f} GiB of "
                f"host memory for {flag} ({e.__class__.__name__}); give a smaller {flag}"
            ) from None
        self.num_slots = num_slots

    @property
    def num_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for _, h in self.pairs)

    def copy(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """A step's row copies: (device row, host slot) out to the host first, then (host slot, device row) in.
        Pages and slots that run on together (up or down: a prefix evicted last page first) move as one
        slice a tensor, not one copy a page; a run whose slots go down is flipped on the device."""
        if swap_out:
            runs = page_runs(swap_out)
            torch._foreach_copy_(
                [h[_span(s, n, step)] for _, h in self.pairs for _, s, n, step in runs],
                [_ordered(d[b : b + n], step) for d, _ in self.pairs for b, _, n, step in runs],
                non_blocking=True,
            )
        if swap_in:
            runs = page_runs(swap_in)
            torch._foreach_copy_(
                [d[_span(b, n, step)] for d, _ in self.pairs for _, b, n, step in runs],
                [_ordered(h[s : s + n], step, d.device) for d, h in self.pairs for s, _, n, step in runs],
                non_blocking=True,
            )


def _span(first: int, n: int, step: int) -> slice:
    """The rows a run of n covers from `first`, going up (step 1) or down (-1)."""
    return slice(first, first + n) if step == 1 else slice(first - n + 1, first + 1)


def _ordered(rows: torch.Tensor, step: int, device: torch.device | None = None) -> torch.Tensor:
    """A run's source rows in its destination's order: as they are, or flipped (on the device: a host
    slice goes over first, asynchronously, from pinned memory)."""
    if step == 1:
        return rows
    if device is not None and rows.device != device:
        rows = rows.to(device, non_blocking=True)
    return rows.flip(0)


def page_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """(source, destination) page pairs as maximal runs (first source, first destination, length, step):
    the sources go up by one, the destinations by `step`, 1 or -1. NOTE: a step's pairs name each page
    and each slot once, so their order is free."""
    runs: list[list[int]] = []
    for a, b in sorted(pairs):
        if runs:
            a0, b0, n, step = runs[-1]
            if a == a0 + n and (b == b0 + n * step if n > 1 else abs(b - b0) == 1):
                runs[-1] = [a0, b0, n + 1, step if n > 1 else b - b0]
                continue
        runs.append([a, b, 1, 1])
    return [(a0, b0, n, step) for a0, b0, n, step in runs]
