"""Recurrent-state slots for hybrid models, and state snapshots for prefix caching.

A running sequence holds one slot (conv state + delta-rule state of every linear-attention layer),
taken at admission and returned at finish or abort. A KV prefix hit is usable on a hybrid model only
together with the recurrent state at exactly that position, so the state is also snapshotted at
page-aligned positions (the end of the prompt, where its second turn and the turn before its last start,
the last page a request completes, every `state_snapshot_interval` tokens) into snapshot slots named by the
page hash of that prefix. The snapshot slots live in the same state tensors after the running slots and are
LRU-evicted, those of shared prefixes last: a snapshot where other conversations will resume (the end of a
tool list or of a system prompt, a client's cache breakpoint; `new_snapshot(shared=True)`) is passed over
while the others keep two slots a running slot (a conversation's prompt end and its last page, which its
next turn resumes from), unless nothing else can go; a conversation's own snapshots (those two, the
intervals) would otherwise push them out within a few of its turns.

With speculative decoding a running slot also has a backup slot (after the snapshots): the state before
a step that verifies drafts, copied back when one is rejected.
"""

from __future__ import annotations

from collections import OrderedDict


class StatePool:
    def __init__(self, num_slots: int, num_snapshots: int = 0, backups: bool = False):
        self.num_slots, self.num_snapshots = num_slots, num_snapshots
        self.num_backups = num_slots if backups else 0
        self._free = list(range(num_slots - 1, -1, -1))
        # snapshot slots: num_slots .. num_slots + num_snapshots - 1
        self._free_snapshots = list(range(num_slots + num_snapshots - 1, num_slots - 1, -1))
        self.snapshots: OrderedDict[bytes, int] = OrderedDict()  # prefix hash -> snapshot slot, LRU first
        self._pinned: set[int] = set()  # snapshot slots read or written in the step being scheduled
        self._written: set[int] = set()  # of those, the ones it writes
        self._fresh: set[bytes] = set()  # snapshots saved by the step being scheduled (not written yet)
        self._shared: set[bytes] = set()  # snapshots of prefixes other conversations share, evicted last

    @property
    def num_total_slots(self) -> int:
        return self.num_slots + self.num_snapshots + self.num_backups

    @property
    def backup_slot_base(self) -> int | None:
        """Running slot s is backed up at backup_slot_base + s; None without backups."""
        return self.num_slots + self.num_snapshots if self.num_backups else None

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        assert self._free, "no free recurrent-state slot"
        return self._free.pop()

    def free(self, slot: int) -> None:
        assert 0 <= slot < self.num_slots and slot not in self._free, f"bad state slot {slot}"
        self._free.append(slot)

    @property
    def num_shared_snapshots(self) -> int:
        """Snapshots held as shared prefixes (evicted last)."""
        return len(self._shared)

    # -- snapshots ---------------------------------------------------------------------------
    def find_snapshot(self, prefix_hash: bytes) -> int | None:
        slot = None if prefix_hash in self._fresh else self.snapshots.get(prefix_hash)
        if slot is not None:
            self.snapshots.move_to_end(prefix_hash)
            self._pinned.add(slot)
        return slot

    def new_snapshot(self, prefix_hash: bytes, shared: bool = False) -> int | None:
        """A snapshot slot to save the state at this prefix into; None when one exists or none is free.
        `shared`: a prefix other conversations will resume from (evicted last; one that exists becomes so)."""
        if self.num_snapshots == 0 or prefix_hash in self.snapshots:
            if shared and prefix_hash in self.snapshots:
                self._shared.add(prefix_hash)
            return None
        if self._free_snapshots:
            slot = self._free_snapshots.pop()
        else:
            victim = self._victim()
            if victim is None:
                return None
            slot = self.snapshots.pop(victim)
            self._shared.discard(victim)
        self.snapshots[prefix_hash] = slot
        if shared:
            self._shared.add(prefix_hash)
        self._pinned.add(slot)
        self._written.add(slot)
        self._fresh.add(prefix_hash)
        return slot

    def _victim(self) -> bytes | None:
        """The snapshot to evict, least recently used first: one not in use this step, else one this step
        only reads (its restore is copied before the step's forward, the saves after it, so a save may
        overwrite it); shared ones passed over while the others keep two slots a running slot, unless
        nothing else can go."""
        idle = [h for h, s in self.snapshots.items() if s not in self._pinned]
        read = [h for h, s in self.snapshots.items() if s in self._pinned and s not in self._written]
        if len(self._shared) > self.num_snapshots - 2 * self.num_slots:
            order = idle + read
        else:
            own = [h for h in (*idle, *read) if h not in self._shared]
            order = own + [h for h in (*idle, *read) if h in self._shared]
        return order[0] if order else None

    def drop_snapshot(self, prefix_hash: bytes) -> None:
        slot = self.snapshots.pop(prefix_hash, None)
        if slot is not None and slot not in self._pinned:
            self._free_snapshots.append(slot)
            self._shared.discard(prefix_hash)
        elif slot is not None:
            self.snapshots[prefix_hash] = slot  # in use by this step; LRU eviction takes it later

    def clear_snapshots(self) -> None:
        """Forget every snapshot (those the step being scheduled reads or writes stay until it ends)."""
        for prefix_hash in list(self.snapshots):
            self.drop_snapshot(prefix_hash)

    def end_step(self) -> None:
        """The step's copies are issued; its snapshot slots may be evicted again."""
        self._pinned.clear()
        self._written.clear()
        self._fresh.clear()
