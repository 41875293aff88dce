"""The naive ops' per-step memo: served for equal tensors, recomputed for changed ones, never stale."""

from __future__ import annotations

import torch

from ninfer_kernels.step_memo import StepMemo


def test_served_while_equal_and_recomputed_on_change():
    memo, calls = StepMemo(), []

    def compute(t):
        calls.append(1)
        return t.tolist()

    a = torch.tensor([1, 2, 3])
    assert memo.get((a,), ("x",), lambda: compute(a)) == [1, 2, 3]
    assert memo.get((a.clone(),), ("x",), lambda: compute(a)) == [1, 2, 3]  # an equal tensor
    assert len(calls) == 1
    a[0] = 9  # changed in place: the same object, new values
    assert memo.get((a,), ("x",), lambda: compute(a)) == [9, 2, 3]
    assert memo.get((a,), ("y",), lambda: compute(a)) == [9, 2, 3]  # another extra
    assert memo.get((a[:2],), ("y",), lambda: compute(a[:2])) == [9, 2]  # another shape
    assert memo.get((a.int(),), ("y",), lambda: compute(a)) == [9, 2, 3]  # another dtype
    assert len(calls) == 5


def test_tensor_extras_compare_by_identity():
    memo = StepMemo()
    pos, table = torch.tensor([4]), torch.zeros(3)
    assert memo.get((pos,), (table,), lambda: "first") == "first"
    assert memo.get((pos,), (table,), lambda: "again") == "first"
    assert memo.get((pos,), (torch.zeros(3),), lambda: "other table") == "other table"


def test_a_tensor_on_another_device_is_a_miss():
    """Equal values on another device (a CUDA engine and a CPU op in one process) are a new plan, not an
    error from comparing across devices."""
    memo = StepMemo()
    a = torch.tensor([1, 2, 3])
    assert memo.get((a,), (), lambda: "cpu") == "cpu"
    assert memo.get((torch.empty(3, dtype=a.dtype, device="meta"),), (), lambda: "meta") == "meta"
    assert memo.get((a,), (), lambda: "cpu again") == "cpu again"
