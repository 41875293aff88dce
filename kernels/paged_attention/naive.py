from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from ninfer_kernels.int8_act.naive import dequantize_act, quantize_act
from ninfer_kernels.kv_quant.naive import read_kv
from ninfer_kernels.paged_attention import same_query_count, takes_decode_kernel
from ninfer_kernels.step_memo import StepMemo


@dataclass(frozen=True)
class _Plan:
    """A step's host-side view of the attention metadata, shared by every layer of the step."""

    cu: list[int]  # cu_seqlens_q
    lens: list[int]  # seq_lens
    block_table: torch.Tensor  # [B, max_blocks] int64
    decode: list[int]  # sequences with one query token
    decode_rows: torch.Tensor | None  # [N] those sequences (a step that mixes them with prefill)
    decode_tokens: torch.Tensor | None  # [N] their query tokens
    decode_mask: torch.Tensor | None  # [N, 1, 1, S] keys each decode row sees (several decode rows)
    runs: list[tuple[int, int, bool]] | None  # the one decode sequence, over an fp32 cache: its slot runs


_PLAN = StepMemo()


def _plan_for(block_table, seq_lens, cu_seqlens_q, block_size: int, in_place: bool) -> _Plan:
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    decode = [b for b in range(len(lens)) if cu[b + 1] - cu[b] == 1]
    rows = tokens = mask = runs = None
    if decode and len(decode) < len(lens):
        rows = torch.tensor(decode, device=block_table.device)
        tokens = torch.tensor([cu[b] for b in decode], device=block_table.device)
    if len(decode) > 1:  # shorter sequences attend to their own length only
        # NOTE: the padding read past them must be finite (KVCache.allocate zeroes the pages)
        max_len = max(lens[b] for b in decode)
        width = -(-max_len // block_size) * block_size
        dl = torch.tensor([lens[b] for b in decode], device=block_table.device)
        mask = (torch.arange(width, device=block_table.device)[None, :] < dl[:, None])[:, None, None, :]
    if len(decode) == 1 and in_place:
        b = decode[0]
        runs = _slot_runs(block_table[b, : -(-lens[b] // block_size)].tolist(), lens[b], block_size)
    table = block_table.to(torch.int64, copy=True)  # a copy: the memo may serve it for an equal tensor
    return _Plan(cu, lens, table, decode, rows, tokens, mask, runs)


def _int8_queries(q: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D] as the int8 prefill kernel sees it: q * scale rounded to int8 per row, divided back."""
    rows = q.float().reshape(-1, q.shape[2]) * scale
    codes, scales, _ = quantize_act(rows, q.shape[2])
    return (dequantize_act(codes, scales) / scale).view(q.shape)


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]; the query tokens of all sequences, packed
    cache,  # engine.cache.kv_layout.KVCache in any KV dtype; dequantized on read
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32; context length of each sequence after this step
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32; query tokens of sequence b are q[cu[b]:cu[b+1]]
    scale: float,
    int8_queries: bool = False,
) -> torch.Tensor:
    """Causal attention of each sequence's new query tokens over its paged K/V (prefix + new tokens).

    The queries of sequence b are its last (cu[b+1] - cu[b]) positions, so one op serves prefill,
    chunked prefill, decode and speculative verification. GQA: Hq is a multiple of Hk.
    Sequences with one query token (decode) are computed together; the others one by one.

    int8_queries (--int8-prefill) over an int8 / k8v4 cache, in a step the Triton path runs through its
    prefill kernel (kernels/paged_attention.takes_decode_kernel): every query row, scaled, is rounded to
    int8 codes per (token, head) as that kernel multiplies them (kernels/int8_act's rounding).
    """
    block_size = cache.k_data.shape[1]
    in_place = cache.k_data.dtype == torch.float32
    plan = _PLAN.get(
        (block_table, seq_lens, cu_seqlens_q),
        (block_size, in_place),
        lambda: _plan_for(block_table, seq_lens, cu_seqlens_q, block_size, in_place),
    )
    cu, lens = plan.cu, plan.lens
    if int8_queries and cache.kv_dtype in ("int8", "k8v4"):
        group = q.shape[1] // cache.k_data.shape[2]
        if not takes_decode_kernel(q.shape[0], len(lens), same_query_count(cu), group):
            q = _int8_queries(q, scale)
    if len(plan.decode) == len(lens):  # a pure decode step: every row, in order
        return _decode(q, cache, plan.block_table, plan, max(lens), scale)
    out = torch.empty_like(q)
    if plan.decode:
        max_len = max(lens[b] for b in plan.decode)
        table = plan.block_table[plan.decode_rows]
        out[plan.decode_tokens] = _decode(q[plan.decode_tokens], cache, table, plan, max_len, scale)
    for b, seq_len in enumerate(lens):
        start, end = cu[b], cu[b + 1]
        q_len = end - start
        if q_len <= 1:
            continue
        k, v = read_kv(cache, plan.block_table[b, : -(-seq_len // block_size)])  # [S', Hk, D] fp32 each
        k, v = k[None, :seq_len], v[None, :seq_len]
        # query i sits at position seq_len - q_len + i: it sees the whole prefix and the new keys up to itself
        # NOTE: 4-D inputs: torch's CPU flash kernel takes them (3-D ones fall back to the slow math path)
        qb = q[start:end].float().transpose(0, 1)[None]  # [1, Hq, Q, D]
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [1, Hk, S, D]
        prefix = seq_len - q_len
        o = attend_parts(qb, kt, vt, [(0, prefix, False), (prefix, seq_len, True)], scale)  # [1, Hq, Q, D]
        out[start:end] = o[0].transpose(0, 1).to(q.dtype)
    return out


def _decode(q, cache, block_table, plan: _Plan, max_len: int, scale: float) -> torch.Tensor:
    """One query token per sequence: q [N, Hq, D] over block_table [N, *] (int64), longest max_len."""
    block_size = cache.k_data.shape[1]
    qd = (q if q.dtype == torch.float32 else q.float()).unsqueeze(2)  # [N, Hq, 1, D]
    if q.shape[0] == 1:
        if plan.runs is not None:  # an fp32 cache read in place: views of the whole cache, run by run
            k, v = cache.flat_views  # [1, Hk, num_blocks * block_size, D] each
            o = attend_parts(qd, k, v, plan.runs, scale).squeeze(2)
            return o if o.dtype == q.dtype else o.to(q.dtype)
        k, v = read_kv(cache, block_table[0, : -(-max_len // block_size)])  # [S', Hk, D]
        k, v = k[None, :max_len].transpose(1, 2), v[None, :max_len].transpose(1, 2)
        return sdpa(qd, k, v, scale=scale, enable_gqa=True).squeeze(2).to(q.dtype)
    k, v = read_kv(cache, block_table[:, : -(-max_len // block_size)])  # [N, S, Hk, D] fp32 each
    mask = plan.decode_mask[..., : k.shape[1]]
    o = sdpa(qd, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True)
    return o.squeeze(2).to(q.dtype)


MAX_RUNS = 32  # more runs of consecutive pages than this: gather the pages instead (18 runs at 4K: 53 vs 83 ms a step)


def _slot_runs(ids: list[int], seq_len: int, block_size: int) -> list[tuple[int, int, bool]] | None:
    """The sequence's key slots in the flat cache as a few runs [(start, end, False)]: its pages `ids`
    grouped into runs of consecutive page ids (softmax attention does not depend on key order), less the
    unused tail of its last page; None when there are more than MAX_RUNS runs."""
    runs: list[list[int]] = []
    for page in sorted(ids):
        if runs and page == runs[-1][1]:
            runs[-1][1] = page + 1
        else:
            runs.append([page, page + 1])
    if len(runs) > MAX_RUNS:
        return None
    used = seq_len - (len(ids) - 1) * block_size  # tokens in the last page
    hole = (ids[-1] * block_size + used, (ids[-1] + 1) * block_size)
    layout = []
    for a, b in runs:
        a, b = a * block_size, b * block_size
        if a <= hole[0] < b:  # the run holding the last page: skip its unused tail
            layout += [(a, hole[0], False), (hole[1], b, False)]
        else:
            layout.append((a, b, False))
    return layout


def attend_parts(q, k, v, parts: list[tuple[int, int, bool]], scale: float) -> torch.Tensor:
    """Attention of q [1, Hq, Q, D] over the key ranges `parts` [(start, end, causal)] of k / v [1, Hk, S, D],
    as if they were one key sequence: on CPU each part by the CPU flash kernel, merged by their log-sum-exps;
    elsewhere (that op is CPU-only) one masked call (causal = the part's keys align with the queries: query i
    sees keys start .. start + i)."""
    parts = [p for p in parts if p[1] > p[0]]
    if len(parts) == 1:
        a, b, causal = parts[0]
        return sdpa(q, k[:, :, a:b], v[:, :, a:b], is_causal=causal, scale=scale, enable_gqa=True)
    if _flash_with_lse is None or q.device.type != "cpu":  # one call over the kept keys, masked
        keep = torch.cat([torch.arange(a, b, device=q.device) for a, b, _ in parts])
        mask = _mask_for(parts, q.shape[2], q.device)
        kk, vv = k.index_select(2, keep), v.index_select(2, keep)
        return sdpa(q, kk, vv, attn_mask=mask, scale=scale, enable_gqa=True)
    outs, lses = [], []
    for a, b, causal in parts:
        o, lse = _flash_with_lse(q, k[:, :, a:b], v[:, :, a:b], 0.0, causal, scale=scale)
        outs.append(o)
        lses.append(lse.unsqueeze(-1))  # [1, Hq, Q, 1]
    top = torch.stack(lses).amax(0)
    weights = [torch.exp(lse - top) for lse in lses]
    return sum(o * w for o, w in zip(outs, weights)) / sum(weights)


def _mask_for(parts, num_q: int, device) -> torch.Tensor:
    """[Q, kept keys] visibility over the concatenated parts, for the single-call path."""
    cols = []
    for a, b, causal in parts:
        if causal:
            cols.append(
                torch.arange(b - a, device=device)[None, :] <= torch.arange(num_q, device=device)[:, None]
            )
        else:
            cols.append(torch.ones(num_q, b - a, dtype=torch.bool, device=device))
    return torch.cat(cols, dim=1)


# torch's CPU flash attention with its log-sum-exp (a private, CPU-only op; without it, and on other devices,
# the parts run as one masked call)
_flash_with_lse = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
