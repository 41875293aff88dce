"""Fixed-size KV pages with refcounts, and a prefix cache over full pages.

A full page (block_size computed tokens) is named by a hash chain: hash(parent page's hash, its tokens),
so one hash names a whole prefix. Pages of finished requests keep their hash while unreferenced and sit
in the free queue in LRU order; a later request whose prompt starts with the same tokens takes them
back instead of recomputing them. Allocation takes never-cached pages first, then evicts the least
recently used cached page.

With a host tier (engine/cache/host_pool.py), an evicted page's KV is copied to host memory first and the
prefix stays findable there: `swap_out` lists the step's (block, host slot) copies, `swap_in` the (host
slot, block) copies of the pages taken back.

NOTE: slot = block_id * block_size + offset indexes the flattened [num_blocks * block_size] cache.
NOTE: only full pages are shared, so a request never writes to a page another request reads.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from engine.cache.host_pool import HostPool

ROOT_HASH = b""


def hash_block(parent: bytes, token_ids: list[int]) -> bytes:
    """The name of a full page: its tokens and (through `parent`) every token before it."""
    return hashlib.blake2b(parent + array("q", token_ids).tobytes(), digest_size=16).digest()


def hash_blocks(
    token_ids: list[int], block_size: int, parent: bytes = ROOT_HASH, salts: list[bytes] | None = None
) -> list[bytes]:
    """Hashes of each full page of `token_ids`, chained from `parent`; `salts`, per page, name what its
    token ids do not (the images whose placeholders it holds)."""
    out = []
    for i, start in enumerate(range(0, len(token_ids) - block_size + 1, block_size)):
        salt = salts[i] if salts else b""
        parent = hash_block(parent + salt, token_ids[start : start + block_size])
        out.append(parent)
    return out


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found in the cache
    host_hits: int = 0  # of those, found in the host tier

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockPool:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, host_slots: int = 0
    ):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # full-page hash -> block id
        # unreferenced pages; never-cached ones at the front, cached ones behind in LRU order
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.stats = PrefixCacheStats()
        self.host = HostPool(host_slots) if host_slots > 0 and enable_prefix_caching else None
        self.swap_out: list[tuple[int, int]] = []  # this step's (block, host slot) copies
        self.swap_in: list[tuple[int, int]] = []  # this step's (host slot, block) copies
        # counts changes to the prefixes named (a page registered, a reset): see LLM.save_prefix_cache
        self.version = 0

    @property
    def num_free_blocks(self) -> int:
        """Pages that can be handed out now (free ones and unreferenced cached ones)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def blocks_needed(self, num_tokens: int, num_held: int) -> int:
        """Extra blocks a sequence holding `num_held` blocks needs to store `num_tokens` tokens."""
        return max(0, -(-num_tokens // self.block_size) - num_held)

    def allocate(self, n: int) -> list[int]:
        assert n <= len(self._free), f"asked for {n} blocks with {len(self._free)} free"
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            h = self.block_hash[block_id]
            if h is not None:  # evict: this page no longer names its prefix
                if self.cached.get(h) == block_id:
                    del self.cached[h]
                    slot = self.host.put(h) if self.host is not None else None
                    if slot is not None:  # its KV goes to the host tier before the step writes here
                        self.swap_out.append((block_id, slot))
                self.block_hash[block_id] = None
            self.ref_cnt[block_id] = 1
            out.append(block_id)
        return out

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each page; unreferenced pages become free (cached ones stay named)."""
        # NOTE: reversed, so a request's last pages (the least likely to be shared) are evicted first
        for block_id in reversed(block_ids):
            self.ref_cnt[block_id] -= 1
            assert self.ref_cnt[block_id] >= 0, f"block {block_id} freed twice"
            if self.ref_cnt[block_id] == 0:
                self._free[block_id] = None
                if self.block_hash[block_id] is None:
                    self._free.move_to_end(block_id, last=False)

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """Cached pages for the longest run of leading `hashes` (no references taken)."""
        out = []
        for h in hashes:
            block_id = self.cached.get(h)
            if block_id is None:
                break
            out.append(block_id)
        return out

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference on cached pages a new request reuses."""
        for block_id in block_ids:
            if self.ref_cnt[block_id] == 0:
                del self._free[block_id]
            self.ref_cnt[block_id] += 1

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, on the GPU and in the host tier: pages keep their KV but no longer
        name a prefix (the unreferenced ones are handed out first again)."""
        for block_id, block_hash in enumerate(self.block_hash):
            if block_hash is not None:
                self.block_hash[block_id] = None
                if block_id in self._free:
                    self._free.move_to_end(block_id, last=False)
        self.cached.clear()
        if self.host is not None:
            self.host.clear()
        self.version += 1

    def cached_pages(self) -> list[tuple[bytes, int]]:
        """(hash, block) of every cached page, least recently used first: the unreferenced ones in the free
        queue's order, then those running requests hold."""
        free = [(self.block_hash[b], b) for b in self._free if self.block_hash[b] is not None]
        held = [(h, b) for h, b in self.cached.items() if self.ref_cnt[b] > 0]
        return [(h, b) for h, b in free if self.cached.get(h) == b] + held

    def lookup_host(self, hashes: list[bytes]) -> list[bytes]:
        """The leading run of `hashes` the host tier holds (none without one)."""
        return self.host.lookup(hashes) if self.host is not None else []

    def allocate_with_host(self, n: int, host_hashes: list[bytes]) -> list[int]:
        """`n` fresh pages, the first len(`host_hashes`) of them holding those host-tier pages (copied back
        at the step's start) and named in the GPU prefix cache."""
        # NOTE: their host slots are taken before allocating: the pages it evicts go to the host tier, whose
        # least recently used slots (these among them, when it is full) make room for them
        slots = [self.host.take(h) for h in host_hashes]
        block_ids = self.allocate(n)
        for h, slot, block_id in zip(host_hashes, slots, block_ids):
            self.swap_in.append((slot, block_id))
            self.register(block_id, h)
        return block_ids

    def drain_swaps(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This step's copies, (swap_out, swap_in); the host tier's slots taken last step are free again."""
        out, back = self.swap_out, self.swap_in
        self.swap_out, self.swap_in = [], []
        return out, back

    def begin_step(self) -> None:
        if self.host is not None:
            self.host.end_step()

    def register(self, block_id: int, block_hash: bytes) -> None:
        """Name a page that now holds a full page of computed tokens. A prefix another page names already
        (computed again: a hybrid model's pages past its last snapshot, a request that wants prompt
        log-probabilities) moves its name to this one: the pages a live request holds keep its prefix's
        chain whole, where an older copy, named alone, could be evicted from under it (a prompt whose
        first page another conversation's matched lost its whole cached prefix with that page)."""
        if not self.enable_prefix_caching or self.cached.get(block_hash) == block_id:
            return
        old = self.cached.get(block_hash)
        if old is not None:  # the same tokens: the same KV; the older copy is a plain page now
            self.block_hash[old] = None
            if old in self._free:
                self._free.move_to_end(old, last=False)
        self.block_hash[block_id] = block_hash
        self.cached[block_hash] = block_id
        self.version += 1

    def record_lookup(self, num_queried: int, num_hit: int, num_host_hit: int = 0) -> None:
        self.stats.queries += num_queried
        self.stats.hits += num_hit
        self.stats.host_hits += num_host_hit
