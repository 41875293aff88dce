"""Block tables kept on the device from one step to the next, where a step writes only the pages that are new.

A step's block_table holds every running sequence's pages: at 180K tokens of context, 11,520 pages a row.
Built again each step from the requests' page lists, turning those Python ints into a tensor cost ~0.5 ms
a row on the host (each decode step, and again for the drafter's passes), against a decode step of a few
milliseconds on a big GPU. A sequence's pages change little between steps (one more every `block_size`
tokens), so each row remembers the list it was staged from and how much of it: a row whose list is the
same object and has only grown gets its new entries, any other is staged whole. The host copy is then
sent to the device in one transfer of the rows the step uses.

NOTE: this rests on the scheduler's invariant that a request's `block_ids` list only grows in place (pages
appended); pages are otherwise given as a new list (admission: hits and new pages; freeing: []). The last
entry staged is checked too, so a list changed in place otherwise is staged whole.

Entries past a row's pages keep what earlier sequences left there: valid page ids, which the attention
kernels read only as padding (masked by seq_lens), as they read page 0 before.
"""

from __future__ import annotations

import torch

from engine.transfer import copy_in


class BlockTables:
    def __init__(self, device: torch.device, num_rows: int = 1, max_blocks: int = 1, grows: bool = True):
        """`num_rows` x `max_blocks` to start with; `grows`: a step with more rows or pages than that takes a
        larger table (a new tensor: an eager step's), else it is refused (a CUDA graph's buffer, whose
        address the graph holds)."""
        self.device, self.grows = torch.device(device), grows
        self._allocate(max(1, num_rows), max(1, max_blocks))

    def _allocate(self, num_rows: int, max_blocks: int) -> None:
        # [rows, max_blocks] int32 on the device, and its host copy (the same tensor on the CPU)
        self.table = torch.zeros(num_rows, max_blocks, dtype=torch.int32, device=self.device)
        self.host = (
            self.table if self.device.type == "cpu" else torch.zeros(num_rows, max_blocks, dtype=torch.int32)
        )
        self._lists: list[list[int] | None] = [None] * num_rows  # the list each row was staged from
        self._staged = [0] * num_rows  # how many of its entries
        self._last = [-1] * num_rows  # the last of them

    def stage(self, rows: list[list[int]], num_rows: int | None = None) -> None:
        """Rows 0 .. len(rows) - 1 of the table hold `rows`' pages; the first `num_rows` rows (len(rows) by
        default; a CUDA graph's bucket: its padding rows keep pages of earlier sequences) go to the device."""
        longest = max((len(r) for r in rows), default=0)
        num_rows = len(rows) if num_rows is None else num_rows
        rows_cap, width = self.table.shape
        if num_rows > rows_cap or longest > width:
            assert self.grows, f"a step of {num_rows} rows x {longest} pages in a {rows_cap} x {width} table"
            self._allocate(max(num_rows, rows_cap), max(longest, 2 * width))
        host, lists, staged, last = self.host, self._lists, self._staged, self._last
        for i, row in enumerate(rows):
            n, k = len(row), staged[i]
            if row is not lists[i] or n < k or (k and row[k - 1] != last[i]):
                k = 0  # another sequence's pages, or a list changed in place: the whole row
            if n > k:
                host[i, k:n] = torch.tensor(row[k:], dtype=torch.int32)
            lists[i], staged[i], last[i] = row, n, row[n - 1] if n else -1
        if host is not self.table and num_rows:
            copy_in(self.table[:num_rows], host[:num_rows])  # (the host copy may change before it is read)

    def view(self, rows: list[list[int]]) -> torch.Tensor:
        """`rows` staged: [len(rows), longest row] int32 on the device, contiguous (the CPU's native
        attention reads rows that long; one small copy where the slice is not)."""
        self.stage(rows)
        return self.table[: len(rows), : max(len(r) for r in rows)].contiguous()
