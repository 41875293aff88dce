"""Per-step attention metadata, set by the model runner around each forward.

Model forward signatures stay (input_ids, positions); layers read what they need from here.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from engine.transfer import to_device
from ninfer_kernels.paged_attention import same_query_count


@dataclass(frozen=True)
class ForwardContext:
    cu_seqlens_q: torch.Tensor  # [B + 1] int32; query tokens of sequence b: [cu[b], cu[b+1])
    seq_lens: torch.Tensor  # [B] int32; context length of each sequence after this step
    slot_mapping: torch.Tensor  # [T] int64; KV cache slot of each new token
    block_table: torch.Tensor  # [B, max_blocks] int32
    state_indices: torch.Tensor  # [B] int32; recurrent-state slot of each sequence (hybrid models)
    # host int: the query tokens of every sequence when all have the same count (1 in decode, k + 1 when
    # verifying k drafts), else 0; lets attention pick its decode kernel without reading cu_seqlens_q
    query_tokens_per_seq: int = 0
    # host bool: --int8-prefill is on and the step carries a prompt chunk (a request runs more known tokens
    # than 1 + draft tokens): packed weights multiply int8 activations (engine/quant/layer.GroupwiseWeight.
    # takes_int8) and attention over an int8 / k8v4 cache int8 queries. Decode and verification steps, the
    # graphs' and the MTP head's keep 16-bit activations
    int8_activations: bool = False
    # images in the step's prompt chunks: these token rows [M] int64 take the vision tower's embeddings
    # [M, 1 + deepstack levels, H] instead of the <|image_pad|> token's (engine/vision; DecoderModel)
    image_rows: torch.Tensor | None = None
    image_embeds: torch.Tensor | None = None
    # LoRA: (adapter slot, its rows [n] int64 or None for every row, scale) of each adapter the step runs
    # (engine/lora/adapters.py: Adapters.step_rows)
    lora: tuple[tuple[int, torch.Tensor | None, float], ...] = ()
    # LoRA in a CUDA graph: [S, T] the scale each of the S graph lanes (the adapters loaded at start-up, by
    # slot) has on each row, 0 where the row does not run it; every layer runs every lane
    lora_lanes: torch.Tensor | None = None


def paged_context(
    cu_seqlens: list[int],
    seq_lens: list[int],
    slot_mapping: list[int],
    block_table: torch.Tensor,
    device: torch.device,
) -> ForwardContext:
    """A context from host lists and a staged block table ([B, pages] on the device: BlockTables.view),
    without recurrent state: a drafter's pass (the MTP head, a draft model)."""
    return ForwardContext(
        cu_seqlens_q=to_device(cu_seqlens, torch.int32, device),
        seq_lens=to_device(seq_lens, torch.int32, device),
        slot_mapping=to_device(slot_mapping, torch.int64, device),
        block_table=block_table,
        state_indices=to_device([-1] * block_table.shape[0], torch.int32, device),
        query_tokens_per_seq=same_query_count(cu_seqlens),
    )


def slot_of(block_ids: list[int], pos: int, block_size: int) -> int:
    """The KV slot of position `pos` in a sequence's pages."""
    return block_ids[pos // block_size] * block_size + pos % block_size


_CONTEXT: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    assert _CONTEXT is not None, "a layer ran outside of set_forward_context()"
    return _CONTEXT


def current_forward_context() -> ForwardContext | None:
    """The step's context, or None outside any forward (the head over a step's sampled rows, say)."""
    return _CONTEXT


@contextmanager
def set_forward_context(ctx: ForwardContext):
    global _CONTEXT
    prev, _CONTEXT = _CONTEXT, ctx
    try:
        yield
    finally:
        _CONTEXT = prev
