"""Whole-sequence next-token log-probabilities from a loaded LLM, for calibration and quality measurements."""

from __future__ import annotations

import torch

from engine.worker.forward_context import ForwardContext, set_forward_context


@torch.inference_mode()
def sequence_logprobs(llm, tokens: list[int]) -> torch.Tensor:
    """log p(· | tokens[:i+1]) for every position i of one sequence: [T, V] fp32.

    Runs the model directly over KV pages 0.. and recurrent-state slot 0 (reset first); the LLM must have
    no requests in flight and a KV pool of at least len(tokens) tokens.
    """
    n, block_size = len(tokens), llm.engine_config.block_size
    assert n <= llm.scheduler.block_pool.num_blocks * block_size, "the sequence does not fit the KV pool"
    assert not llm.has_unfinished_requests(), "sequence_logprobs needs an idle LLM"
    if llm.runner._state_layers:
        llm.runner._reset_state(0)
    device = llm.runner.device
    ctx = ForwardContext(
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
        slot_mapping=torch.arange(n, device=device),
        block_table=torch.arange(-(-n // block_size), dtype=torch.int32, device=device)[None],
        state_indices=torch.tensor([0], dtype=torch.int32, device=device),
        int8_activations=llm.engine_config.int8_prefill,  # a prompt, as a prefill step runs it
    )
    ids = torch.tensor(tokens, device=device)
    with set_forward_context(ctx):
        hidden = llm.model(ids, torch.arange(n, device=device))
    return torch.log_softmax(llm.model.compute_logits(hidden), dim=-1)
