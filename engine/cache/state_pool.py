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

A host tier (`host_slots`, engine/cache/host_pool.py) keeps evicted snapshots in host memory, named by the
same hash: a later request that resumes there (an agent's turn after its subagent's turns took every GPU
slot) has the snapshot copied back into a GPU snapshot slot and restores from it. Only those where a
conversation resumes go there (`keep_evicted`: a prompt's end, a turn's start, a hint, a reply's last
page), not the interval points, which only a prompt departing there would need. As with KV pages the tiers
are exclusive, and the copies run at the start of the step, before its forward: `swap_out` (GPU snapshot
slot, host slot) first, then `swap_in` (host slot, GPU snapshot slot), then the restores. So a snapshot taken
back claims a GPU slot nothing reads this step (`_victim(idle_only=True)`), while an ordinary save, written
after the forward, may take one the step only reads.

A conversation's snapshots are superseded by its next turn's: a request that resumes from a snapshot an
earlier request saved past the conversation's head (its system turn and first message, which other
conversations may share: a tool list, a document; the scheduler knows where it ends), and saves its own
prompt's end, supersedes every snapshot the earlier one saved past the head (`owner_of`, `supersede`): its
prompt's end, its reply's last page, its turn points and cache breakpoints. Those go first, in either
tier, and the host tier keeps one only in a free slot or another superseded one's. So an agent's many
turns in a row (or a subagent's, while the agent waits for it) evict their own older turns' snapshots,
not the last ones of the conversation that waits, which plain LRU order would.

With speculative decoding a running slot also has a backup slot (after the snapshots): the state before
a step that verifies drafts, copied back when one is rejected.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.cache.host_pool import HostPool

# the host tier's default size, per GPU snapshot slot: an agent and three subagents alternating at one request
# (Claude Code's parallel Task subagents on a server running one request at a time) each resume where their
# last turn ended (benchmarks/subagent_resume.py --subagents 3)
HOST_SNAPSHOTS_PER_SLOT = 3


class StatePool:
    def __init__(self, num_slots: int, num_snapshots: int = 0, backups: bool = False, host_slots: int = 0):
        """`host_slots`: the host tier's snapshots (none without GPU snapshot slots to evict from)."""
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
        self._no_host: set[bytes] = set()  # snapshots not copied to the host tier when evicted
        self._owner: dict[bytes, tuple[str, int]] = {}  # either tier: (the request that saved it, position)
        self._superseded: set[bytes] = set()  # GPU snapshots a newer turn of their conversation supersedes
        self.attach_host(host_slots)
        self.swap_out: list[tuple[int, int]] = []  # this step's (snapshot slot, host slot) copies
        self.swap_in: list[tuple[int, int]] = []  # this step's (host slot, snapshot slot) copies

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
            self._superseded.discard(prefix_hash)  # resumed from again: live until a newer turn supersedes it
            self._pinned.add(slot)
        return slot

    def new_snapshot(
        self,
        prefix_hash: bytes,
        shared: bool = False,
        keep_evicted: bool = True,
        owner: tuple[str, int] | None = None,
    ) -> int | None:
        """A snapshot slot to save the state at this prefix into; None when one exists or none is free.
        `shared`: a prefix other conversations will resume from (evicted last; one that exists becomes so).
        `owner`: (the request saving it, the position), for `supersede`."""
        if self.num_snapshots == 0 or prefix_hash in self.snapshots:
            if shared and prefix_hash in self.snapshots:
                self._shared.add(prefix_hash)
            return None
        slot = self._claim(idle_only=False)
        if slot is None:
            return None
        self._name(slot, prefix_hash, shared)
        self._fresh.add(prefix_hash)  # (its state is there only after the step's forward)
        if self.host is not None:  # computed again (no GPU slot could take it back): the tiers stay exclusive
            self.host.discard(prefix_hash)
        if not keep_evicted:
            self._no_host.add(prefix_hash)
        if owner is not None:
            self._owner[prefix_hash] = owner
        return slot

    def is_shared(self, prefix_hash: bytes) -> bool:
        """Whether this GPU snapshot is held as a shared prefix's (evicted last)."""
        return prefix_hash in self._shared

    def owner_of(self, prefix_hash: bytes) -> tuple[str, int] | None:
        """(the request that saved this snapshot, its position); None when not known."""
        return self._owner.get(prefix_hash)

    def supersede(self, owner: str, after: int, keep_shared: bool = False) -> None:
        """A newer turn of `owner`'s conversation saved its own prompt's end: every snapshot `owner` saved
        past position `after` (the conversation's head) goes before the others, in either tier; with
        `keep_shared`, not those held as shared."""
        for prefix_hash in [h for h, (o, at) in self._owner.items() if o == owner and at > after]:
            if keep_shared and prefix_hash in self._shared:
                continue
            if prefix_hash in self.snapshots:
                self._superseded.add(prefix_hash)
                self._shared.discard(prefix_hash)
            elif self.host is not None:
                self.host.supersede(prefix_hash)
            self._owner.pop(prefix_hash)

    def _prune_owners(self, every: bool = False) -> None:
        """Forget the owners of snapshots neither tier holds any longer (the host tier evicts by itself):
        once they outnumber the slots, or `every` time."""
        held = self.num_snapshots + (self.host.num_slots if self.host is not None else 0)
        if every or len(self._owner) > held:
            for prefix_hash in [h for h in self._owner if h not in self.snapshots and not self._in_host(h)]:
                del self._owner[prefix_hash]

    def _in_host(self, prefix_hash: bytes) -> bool:
        return self.host is not None and prefix_hash in self.host.slots

    def in_host(self, prefix_hash: bytes) -> bool:
        """Whether the host tier holds this prefix's snapshot and a GPU slot could take it back this step."""
        return self._in_host(prefix_hash) and self._can_claim_idle()

    def take_from_host(self, prefix_hash: bytes, shared: bool = False) -> int:
        """Take a host-tier snapshot back (after `in_host`): its GPU snapshot slot, to restore from this step
        (copied back at the step's start, before the restores)."""
        # NOTE: its host slot taken first: the snapshot the GPU slot evicts goes to the host tier, whose
        # least recently used snapshot (this one among them, when it is full) makes room for it
        host_slot = self.host.take(prefix_hash)  # (and live again, as find_snapshot makes a GPU one)
        slot = self._claim(idle_only=True)
        assert slot is not None, "take_from_host without a GPU slot to take it (ask in_host first)"
        self.swap_in.append((host_slot, slot))
        self._name(slot, prefix_hash, shared)
        return slot

    def _name(self, slot: int, prefix_hash: bytes, shared: bool) -> None:
        self.snapshots[prefix_hash] = slot
        if shared:
            self._shared.add(prefix_hash)
        self._pinned.add(slot)
        self._written.add(slot)

    def _claim(self, idle_only: bool) -> int | None:
        """A snapshot slot to write: a free one, else an evicted snapshot's (copied to the host tier first,
        when there is one); None when none can go."""
        if self._free_snapshots:
            return self._free_snapshots.pop()
        victim = self._victim(idle_only)
        if victim is None:
            return None
        slot = self.snapshots.pop(victim)
        self._shared.discard(victim)
        keep = self.host is not None and victim not in self._no_host
        self._no_host.discard(victim)
        superseded = victim in self._superseded
        self._superseded.discard(victim)
        host_slot = self.host.put(victim, superseded) if keep else None
        if host_slot is not None:
            # NOTE: a host slot this step already writes (a tier smaller than a step's evictions) is
            # written once, by the newest: the earlier copy is dropped, as its name was
            self.swap_out = [(s, h) for s, h in self.swap_out if h != host_slot] + [(slot, host_slot)]
        elif not self._in_host(victim):  # in neither tier now
            self._owner.pop(victim, None)
        return slot

    def _can_claim_idle(self) -> bool:
        return bool(self._free_snapshots) or self._victim(idle_only=True) is not None

    def _victim(self, idle_only: bool = False) -> bytes | None:
        """The snapshot to evict, least recently used first: one not in use this step, else (not
        `idle_only`) one this step only reads (its restore is copied before the step's forward, the saves
        after it, so a save may overwrite it); superseded ones first, shared ones passed over while the
        others keep two slots a running slot, unless nothing else can go."""
        idle = [h for h, s in self.snapshots.items() if s not in self._pinned]
        read = (
            []
            if idle_only
            else [h for h, s in self.snapshots.items() if s in self._pinned and s not in self._written]
        )
        superseded = [h for h in (*idle, *read) if h in self._superseded]
        if superseded:
            return superseded[0]
        if len(self._shared) > self.num_snapshots - 2 * self.num_slots:
            order = idle + read
        else:
            own = [h for h in (*idle, *read) if h not in self._shared]
            order = own + [h for h in (*idle, *read) if h in self._shared]
        return order[0] if order else None

    def drop_snapshot(self, prefix_hash: bytes) -> None:
        """Forget a snapshot (a superseded rolling one), in either tier."""
        if self.host is not None:
            self.host.discard(prefix_hash)
        slot = self.snapshots.pop(prefix_hash, None)
        if slot is not None and slot not in self._pinned:
            self._free_snapshots.append(slot)
            self._shared.discard(prefix_hash)
            self._no_host.discard(prefix_hash)
            self._superseded.discard(prefix_hash)
            self._owner.pop(prefix_hash, None)
        elif slot is not None:
            self.snapshots[prefix_hash] = slot  # in use by this step; LRU eviction takes it later
        else:
            self._owner.pop(prefix_hash, None)

    def clear_snapshots(self) -> None:
        """Forget every snapshot, in both tiers (those the step being scheduled reads or writes stay until
        it ends)."""
        for prefix_hash in list(self.snapshots):
            self.drop_snapshot(prefix_hash)
        self._no_host.intersection_update(self.snapshots)
        if self.host is not None:
            self.host.clear()
        self._prune_owners(every=True)

    def attach_host(self, host_slots: int) -> None:
        """A host tier of `host_slots` snapshots (before the first step)."""
        self.host = HostPool(host_slots) if host_slots > 0 and self.num_snapshots > 0 else None

    @property
    def num_host_snapshots(self) -> int:
        return self.host.num_used if self.host is not None else 0

    def drain_swaps(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This step's host-tier copies, (swap_out, swap_in)."""
        out, back = self.swap_out, self.swap_in
        self.swap_out, self.swap_in = [], []
        return out, back

    def end_step(self) -> None:
        """The step's copies are issued (they run in order, before the next step's): its snapshot slots may
        be evicted again, and the host slots it took back are free."""
        self._pinned.clear()
        self._written.clear()
        self._fresh.clear()
        self._prune_owners()
        if self.host is not None:
            self.host.end_step()
