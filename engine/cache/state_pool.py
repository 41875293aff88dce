"""Recurrent-state slots for hybrid models: one per running sequence, taken at admission, returned at finish."""

from __future__ import annotations


class StatePool:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        assert self._free, "no free recurrent-state slot"
        return self._free.pop()

    def free(self, slot: int) -> None:
        assert 0 <= slot < self.num_slots and slot not in self._free, f"bad state slot {slot}"
        self._free.append(slot)
