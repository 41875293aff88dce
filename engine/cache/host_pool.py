"""The prefix cache's second tier in host memory (`--host-cache`): full KV pages evicted from the GPU pool
are copied to host slots, named by the same prefix hash, so a later request that starts with that prefix
copies them back instead of computing them again (an agent's long conversation, paused while another
runs, keeps its prefix across the eviction).

The tiers are exclusive: a page taken back to the GPU leaves the host tier (and goes back there when it is
evicted again). Slots live in LRU order; a slot taken this step is reserved until the next, so no copy of
the same step writes it while it is read. Copies run at the start of the step that needs them, host
writes (swap-outs) before host reads (swap-ins), both before the forward writes any page.
"""

from __future__ import annotations

from collections import OrderedDict


class HostPool:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.slots: OrderedDict[bytes, int] = OrderedDict()  # prefix hash -> slot, least recent first
        # NOTE: handed out from the top down: a request's pages are evicted last page first, so their slots
        # run on with them (and back again in prefix order), and the copies go as slices (engine/worker/host_kv.py)
        self._free = list(range(num_slots))
        self._reserved: list[int] = []  # taken this step: free again at the next
        # held prefixes a newer one of their conversation supersedes (a state snapshot tier's): the first to
        # go, and one superseded itself only takes a free slot or another's
        self.superseded: set[bytes] = set()

    @property
    def num_used(self) -> int:
        return len(self.slots)

    def put(self, block_hash: bytes, superseded: bool = False) -> int | None:
        """A slot for an evicted page named `block_hash` (a free one, else a superseded prefix's, else the
        least recently used one's); None when the tier already holds that prefix (the same tokens: the same
        KV), or when nothing may go: every slot reserved this step, or `superseded` and only live prefixes
        held."""
        if block_hash in self.slots:
            self.slots.move_to_end(block_hash)
            return None
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((h for h in self.slots if h in self.superseded), None) if self.superseded else None
            if victim is None:
                if superseded or not self.slots:
                    return None
                victim = next(iter(self.slots))
            slot = self.slots.pop(victim)
            self.superseded.discard(victim)
        self.slots[block_hash] = slot
        if superseded:
            self.superseded.add(block_hash)
        return slot

    def supersede(self, block_hash: bytes) -> None:
        """A held prefix a newer one of its conversation supersedes: evicted before the others."""
        if block_hash in self.slots:
            self.superseded.add(block_hash)

    def lookup(self, hashes: list[bytes]) -> list[bytes]:
        """The longest leading run of `hashes` the tier holds."""
        out = []
        for h in hashes:
            if h not in self.slots:
                break
            out.append(h)
        return out

    def take(self, block_hash: bytes) -> int:
        """Take a page back to the GPU: its slot, reserved until the next step."""
        slot = self.slots.pop(block_hash)
        self.superseded.discard(block_hash)
        self._reserved.append(slot)
        return slot

    def discard(self, block_hash: bytes) -> None:
        """Forget a prefix the tier holds (its slot free again; a copy into it this step is superseded by
        any later one the step makes into the same slot)."""
        slot = self.slots.pop(block_hash, None)
        self.superseded.discard(block_hash)
        if slot is not None:
            self._free.append(slot)

    def end_step(self) -> None:
        """The previous step's copies are done (they run in order): its taken slots are free."""
        self._free.extend(self._reserved)
        self._reserved.clear()

    def clear(self) -> None:
        """Forget every prefix the tier holds (its slots free again; those taken this step stay reserved)."""
        self._free.extend(self.slots.values())
        self.slots.clear()
        self.superseded.clear()
