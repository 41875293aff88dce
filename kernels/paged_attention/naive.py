import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from kernels.kv_quant.naive import read_kv


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]; the query tokens of all sequences, packed
    cache,  # engine.cache.kv_layout.KVCache in any KV dtype; dequantized on read
    block_table: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32; context length of each sequence after this step
    cu_seqlens_q: torch.Tensor,  # [B + 1] int32; query tokens of sequence b are q[cu[b]:cu[b+1]]
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new query tokens over its paged K/V (prefix + new tokens).

    The queries of sequence b are its last (cu[b+1] - cu[b]) positions, so one op serves prefill,
    chunked prefill, decode and speculative verification. GQA: Hq is a multiple of Hk.
    Sequences with one query token (decode) are computed together; the others one by one.
    """
    block_size = cache.k_data.shape[1]
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    block_table = block_table.long()
    decode = [b for b in range(len(lens)) if cu[b + 1] - cu[b] == 1]
    if len(decode) == len(lens):  # a pure decode step: every row, in order
        return _decode(q, cache, block_table, seq_lens, max(lens), scale)
    out = torch.empty_like(q)
    if decode:
        rows = torch.tensor(decode, device=q.device)
        tokens = torch.tensor([cu[b] for b in decode], device=q.device)
        max_len = max(lens[b] for b in decode)
        out[tokens] = _decode(q[tokens], cache, block_table[rows], seq_lens[rows], max_len, scale)
    for b, seq_len in enumerate(lens):
        start, end = cu[b], cu[b + 1]
        q_len = end - start
        if q_len <= 1:
            continue
        k, v = read_kv(cache, block_table[b, : -(-seq_len // block_size)])  # [S', Hk, D] fp32 each
        k, v = k[:seq_len].transpose(0, 1), v[:seq_len].transpose(0, 1)  # [Hk, S, D]
        # query i sits at position seq_len - q_len + i and sees keys 0 .. that position
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos  # [Q, S]
        qb = q[start:end].float().transpose(0, 1)  # [Hq, Q, D]
        o = sdpa(qb, k, v, attn_mask=mask, scale=scale, enable_gqa=True)  # [Hq, Q, D]
        out[start:end] = o.transpose(0, 1).to(q.dtype)
    return out


def _decode(q, cache, block_table, seq_lens, max_len: int, scale: float) -> torch.Tensor:
    """One query token per sequence: q [N, Hq, D] over block_table [N, *] with lengths seq_lens [N]."""
    block_size = cache.k_data.shape[1]
    k, v = read_kv(cache, block_table[:, : -(-max_len // block_size)])  # [N, S, Hk, D] fp32 each
    mask = None
    if q.shape[0] > 1:  # shorter sequences: attend to their own length only
        # NOTE: the padding read here must be finite (KVCache.allocate zeroes the pages)
        mask = torch.arange(k.shape[1], device=q.device)[None, :] < seq_lens.long()[:, None]  # [N, S]
        mask = mask[:, None, None, :]
    elif k.shape[1] != max_len:
        k, v = k[:, :max_len], v[:, :max_len]
    qd = q.unsqueeze(2) if q.dtype == torch.float32 else q.float().unsqueeze(2)  # [N, Hq, 1, D]
    o = sdpa(qd, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True)
    return o.squeeze(2).to(q.dtype)
