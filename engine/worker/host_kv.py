"""The host tier's KV storage (engine/cache/host_pool.py): for every tensor of every attention layer's
paged cache ([num_blocks, block_size, ...]: data and, for quantized KV dtypes, scales), a host tensor of
the same page shape with one row a host slot; pinned on CUDA, so page copies run asynchronously in stream
order (no host sync: the step's swap-outs, then its swap-ins, then its forward)."""

from __future__ import annotations

import psutil
import torch

from engine.cache.kv_layout import KVCache
from engine.errors import NinferError

HOST_MARGIN = 2 << 30  # host memory the tier leaves to the system and the server itself


def page_tensors(caches: list[KVCache]) -> list[torch.Tensor]:
    return [t for c in caches for t in (c.k_data, c.v_data, c.k_scale, c.v_scale) if t is not None]


def page_bytes(caches: list[KVCache]) -> int:
    """Bytes one KV page holds across every attention layer (what a host slot stores)."""
    return sum(t[0].numel() * t.element_size() for t in page_tensors(caches))


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


def host_slots_for(host_cache: int, page: int) -> int:
    """How many KV pages `host_cache` bytes of host memory hold; refused in a sentence when the memory is
    not free or holds no page."""
    check_host_memory(host_cache)
    slots = host_cache // page
    if slots == 0:
        raise NinferError(f"--host-cache {host_cache} B holds no KV page ({page} B each); give at least that")
    return slots


class HostKV:
    def __init__(self, caches: list[KVCache], num_slots: int, device: torch.device):
        pin = device.type == "cuda"
        try:
            self.pairs = [
                (t, torch.empty((num_slots, *t.shape[1:]), dtype=t.dtype, pin_memory=pin))
                for t in page_tensors(caches)
            ]
        except RuntimeError as e:  # the driver could not pin (lock) that much host memory
            raise NinferError(
                f"could not {'pin' if pin else 'allocate'} {num_slots} KV pages of host memory for "
                f"--host-cache ({e.__class__.__name__}); use a smaller --host-cache"
            ) from None
        self.num_slots = num_slots

    @property
    def num_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for _, h in self.pairs)

    def copy(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """A step's page copies: (KV page, host slot) out to the host first, then (host slot, KV page) in;
        pages and slots that both run on by one are copied as one slice (a long prefix: a few copies a
        tensor, not one a page)."""
        if swap_out:
            runs = page_runs(swap_out)
            torch._foreach_copy_(
                [h[s : s + n] for _, h in self.pairs for _, s, n in runs],
                [d[b : b + n] for d, _ in self.pairs for b, _, n in runs],
                non_blocking=True,
            )
        if swap_in:
            runs = page_runs(swap_in)
            torch._foreach_copy_(
                [d[b : b + n] for d, _ in self.pairs for _, b, n in runs],
                [h[s : s + n] for _, h in self.pairs for s, _, n in runs],
                non_blocking=True,
            )


def page_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(source, destination) page pairs as maximal runs (source, destination, length) along which both
    step by one. NOTE: a step's pairs name each page and each slot once, so their order is free."""
    runs: list[tuple[int, int, int]] = []
    for a, b in sorted(pairs):
        if runs and a == runs[-1][0] + runs[-1][2] and b == runs[-1][1] + runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((a, b, 1))
    return runs
