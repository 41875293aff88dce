import torch

from kernels.kv_quant.naive import quantize_int4_grouped, quantize_int8


def kv_store(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    cache,  # engine.cache.kv_layout.KVCache: data [num_blocks, block_size, Hk, D'] (+ scales)
    slot_mapping: torch.Tensor,  # [T] int64; slot = block_id * block_size + offset; -1 = skip
) -> None:
    """Write the step's K/V into the paged cache at slot_mapping (in place), quantizing for its KV dtype."""
    slots = slot_mapping
    if bool((slot_mapping < 0).any()):  # padding tokens (no slot)
        valid = slot_mapping >= 0
        slots, k, v = slot_mapping[valid], k[valid], v[valid]

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.view(-1, *dst.shape[2:])[slots] = src.to(dst.dtype)

    if cache.kv_dtype in ("int8", "k8v4"):
        kq, ks = quantize_int8(k)
        put(cache.k_data, kq)
        put(cache.k_scale, ks)
        vq, vs = quantize_int8(v) if cache.kv_dtype == "int8" else quantize_int4_grouped(v)
        put(cache.v_data, vq)
        put(cache.v_scale, vs)
    else:
        put(cache.k_data, k)
        put(cache.v_data, v)
