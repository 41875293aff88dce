import torch

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
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = cache.k_data.shape[1], cache.k_data.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        start, end = cu[b], cu[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        num_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_table[b, :num_blocks].long()
        k, v = read_kv(cache, blocks, seq_len)  # [S, Hk, D] fp32 each
        qb = q[start:end].float().view(q_len, num_kv_heads, group, head_dim)  # [Q, Hk, G, D]
        scores = torch.einsum("qhgd,shd->hgqs", qb, k) * scale  # [Hk, G, Q, S]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = scores.softmax(dim=-1)
        o = torch.einsum("hgqs,shd->qhgd", probs, v)  # [Q, Hk, G, D]
        out[start:end] = o.reshape(q_len, num_heads, head_dim).to(q.dtype)
    return out
