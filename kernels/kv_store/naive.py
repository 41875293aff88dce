import torch

from ninfer_kernels.kv_quant.naive import FP8_DTYPES, quantize_int4_grouped, quantize_int8
from ninfer_kernels.step_memo import StepMemo

# every layer of a step stores at the same slots
_SLOTS = StepMemo()


def _valid_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The slots to write, and the mask of the tokens that have one (None: all of them)."""
    valid = slot_mapping >= 0
    if bool(valid.all()):
        return slot_mapping.clone(), None  # a copy: the memo may serve it for an equal tensor
    return slot_mapping[valid], valid


def kv_store(
    k: torch.Tensor,  # [T, Hk, D]
    v: torch.Tensor,  # [T, Hk, D]
    cache,  # engine.cache.kv_layout.KVCache: data [num_blocks, block_size, Hk, D'] (+ scales)
    slot_mapping: torch.Tensor,  # [T] int64; slot = block_id * block_size + offset; -1 = skip
) -> None:
    """Write the step's K/V into the paged cache at slot_mapping (in place), quantizing for its KV dtype."""
    slots, valid = _SLOTS.get((slot_mapping,), (), lambda: _valid_slots(slot_mapping))
    if valid is not None:  # padding tokens (no slot)
        k, v = k[valid], v[valid]

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        src = src if src.dtype == dst.dtype else src.to(dst.dtype)
        if dst.dtype in FP8_DTYPES:
            dst.view(-1, *dst.shape[2:])[slots] = src
        else:
            dst.view(-1, *dst.shape[2:]).index_copy_(0, slots, src)

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
