import torch


def kv_store(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hk, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hk, D]
    slot_mapping: torch.Tensor,  # [T] int64; slot = block_id * block_size + offset; -1 = skip
) -> None:
    """Write the step's K/V into the paged cache at slot_mapping (in place)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = k[valid].to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = v[valid].to(v_cache.dtype)
