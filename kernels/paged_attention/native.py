"""ctypes entry of native.c; None where it does not apply (the caller then runs the naive twin): fp32 q, a
cache of any KV dtype but fp8, int32 metadata, and at most MAX_QUERY_TOKENS query tokens per sequence
(decode and speculative verification; prefill runs torch's flash kernel on two cores)."""

from __future__ import annotations

import torch

from ninfer_kernels.native_build import KV_MODES, cache_readable, check, library

MAX_QUERY_TOKENS = 16


def paged_attention(q, cache, block_table, seq_lens, cu_seqlens_q, scale):
    mode = KV_MODES.get(cache.kv_dtype)
    if mode is None or q.dtype != torch.float32 or q.dim() != 3:
        return None
    num_tokens, num_seqs = q.shape[0], seq_lens.shape[0]
    # every sequence decodes (or verifies a few drafts) when the tokens are few per sequence
    if num_tokens > MAX_QUERY_TOKENS * num_seqs:
        return None
    i32 = torch.int32  # written out, not looped: this runs for every layer of every decode step
    meta_ok = block_table.dtype == i32 and seq_lens.dtype == i32 and cu_seqlens_q.dtype == i32
    meta_ok = meta_ok and block_table.is_contiguous() and seq_lens.is_contiguous()
    if not (meta_ok and cu_seqlens_q.is_contiguous() and cache_readable(cache)):
        return None
    kc, vc, ks, vs = cache.k_data, cache.v_data, cache.k_scale, cache.v_scale
    num_blocks, block_size, hk, d = kc.shape
    shapes_ok = q.shape[2] == d and q.shape[1] % hk == 0 and block_table.dim() == 2
    if not shapes_ok or block_table.shape[0] != num_seqs or cu_seqlens_q.shape != (num_seqs + 1,):
        return None
    q = q.contiguous()
    out = torch.empty_like(q)
    rc = library().ninfer_decode_attention(
        q.data_ptr(),
        out.data_ptr(),
        kc.data_ptr(),
        vc.data_ptr(),
        None if ks is None else ks.data_ptr(),
        None if vs is None else vs.data_ptr(),
        block_table.data_ptr(),
        seq_lens.data_ptr(),
        cu_seqlens_q.data_ptr(),
        num_tokens,
        num_seqs,
        block_table.shape[1],
        block_size,
        q.shape[1],
        hk,
        d,
        num_blocks,
        mode,
        scale,
    )
    check(rc, "paged_attention")
    return out
