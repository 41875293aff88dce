"""The split-K GEMVs' epilogue: each K slice's partial sums into a zeroed fp32 buffer, the tile's last slice
to arrive storing the total (one kernel a GEMV: no memset before it, no cast after)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split_k_store(acc, mask, dst, sums, arrivals_ptr, tile, SPLIT_K: tl.constexpr):
    """Store acc ([BLOCK_M, BLOCK_N] fp32) at dst (pointers in the output's dtype), or, SPLIT_K, add it at
    sums (the matching fp32 buffer pointers) and let the last of the tile's tl.num_programs(2) slices store
    the total and leave its part of the buffer and its counter (arrivals_ptr + tile) zero again."""
    if SPLIT_K:
        tl.atomic_add(sums, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()  # all the program's adds come before its arrival, whose release publishes them
        if tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == tl.num_programs(2) - 1:
            total = tl.load(sums, mask=mask, other=0.0, cache_modifier=".cg")  # from L2, where the adds are
            tl.store(dst, total.to(dst.dtype.element_ty), mask=mask)
            tl.store(sums, tl.zeros_like(total), mask=mask)
            tl.store(arrivals_ptr + tile, 0)
    else:
        tl.store(dst, acc.to(dst.dtype.element_ty), mask=mask)
