"""Fixed-size KV pages: a free list with all-or-nothing allocation.

NOTE: slot = block_id * block_size + offset indexes the flattened [num_blocks * block_size] cache.
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int, num_held: int) -> int:
        """Extra blocks a sequence holding `num_held` blocks needs to store `num_tokens` tokens."""
        return max(0, -(-num_tokens // self.block_size) - num_held)

    def allocate(self, n: int) -> list[int]:
        assert n <= len(self._free), f"asked for {n} blocks with {len(self._free)} free"
        return [self._free.popleft() for _ in range(n)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)
