"""BlockTables (engine/worker/block_table.py): the device block table a step stages holds each row's pages,
whatever the rows did since the last step (grew, were replaced, reordered, shrank, left), and a row whose
page list only grew gets only its new pages."""

from __future__ import annotations

import random

import pytest
import torch

from engine.worker.block_table import BlockTables


def assert_holds(table: torch.Tensor, rows: list[list[int]]) -> None:
    for i, row in enumerate(rows):
        assert table[i, : len(row)].tolist() == row


@pytest.mark.parametrize("seed", range(4))
def test_the_table_holds_each_steps_rows(seed):
    rng = random.Random(seed)
    tables = BlockTables(torch.device("cpu"), 2, 3)  # (grows: more rows, longer rows)
    live = [[rng.randrange(1000) for _ in range(rng.randint(1, 5))] for _ in range(3)]
    for _ in range(200):
        move = rng.random()
        i = rng.randrange(len(live))
        if move < 0.5:  # a decode step's new page
            live[i].extend(rng.randrange(1000) for _ in range(rng.randint(0, 2)))
        elif move < 0.6:  # pages given again as a new list (preempted and admitted again)
            live[i] = [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
        elif move < 0.7 and len(live) > 1:  # a request finished: the rows after it move up
            live.pop(i)
        elif move < 0.8 and len(live) < 6:  # one admitted
            live.insert(i, [rng.randrange(1000) for _ in range(rng.randint(1, 9))])
        elif move < 0.9:  # a step of some of them, in another order
            rows = rng.sample(live, rng.randint(1, len(live)))
            assert_holds(tables.view(rows), rows)
            continue
        else:  # a list shorter in place, then longer again (no scheduler does so: its last entry tells)
            live[i][-1] = 1000 + rng.randrange(1000)
        view = tables.view(live)
        # (contiguous: the CPU's native attention takes no other; a batch fell back to the naive twin)
        assert view.shape == (len(live), max(len(r) for r in live)) and view.is_contiguous()
        assert_holds(view, live)


def test_a_row_that_only_grew_gets_only_its_new_pages():
    tables = BlockTables(torch.device("cpu"), 2, 8)
    a, b = [1, 2, 3], [4, 5]
    tables.stage([a, b])
    tables.table[0, 0] = -7  # (what a step that wrote the whole row again would overwrite)
    a.append(9)
    tables.stage([a, b])
    assert tables.table[0, :4].tolist() == [-7, 2, 3, 9] and tables.table[1, :2].tolist() == [4, 5]
    tables.stage([b, a])  # other rows: each staged whole
    assert_holds(tables.table, [b, a])
    c = [7, 8]
    tables.stage([c, a])
    tables.table[0, 0] = -7
    c[1] = 6  # changed in place, not grown: staged whole
    tables.stage([c, a])
    assert tables.table[0, :2].tolist() == [7, 6]


def test_a_graphs_table_does_not_grow():
    tables = BlockTables(torch.device("cpu"), 2, 4, grows=False)
    tables.stage([[1, 2, 3, 4], [5]], 2)
    before = tables.table
    with pytest.raises(AssertionError, match="a step of 1 rows x 5 pages in a 2 x 4 table"):
        tables.stage([[1, 2, 3, 4, 5]])
    with pytest.raises(AssertionError, match="a step of 3 rows"):
        tables.stage([[1], [2]], 3)
    assert tables.table is before


@pytest.mark.gpu
def test_the_device_table_follows_its_host_copy():
    tables = BlockTables(torch.device("cuda"), 2, 4, grows=False)
    rows = [[3, 1], [2]]
    for page in range(5, 9):  # each row grows in turn, and then a new list takes row 0
        tables.stage(rows, 2)
        assert_holds(tables.table.cpu(), rows)
        rows[page % 2].append(page)
    rows[0] = [0, 6]
    tables.stage(rows, 2)
    assert_holds(tables.table.cpu(), rows)
