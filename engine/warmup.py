"""Start-up warm-up on a GPU: one throwaway request through the prefill paths (a first chunk, a chunk after
cached tokens, a short tail) and a few decode steps (with drafts, under --spec), sampled (the sampler's
race noise and a drafter's race are kernels too), so the Triton kernels those shapes need are compiled
(or read from Triton's cache) before the first request waits on them, as the decode kernels are by the
CUDA graph capture. Everything it leaves is then forgotten: its pages' prefix-cache names, the counters
/metrics reads, the request ids."""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING

from engine.errors import NinferError
from engine.pooling import POOLED
from engine.request import SamplingParams

if TYPE_CHECKING:
    from engine.llm import LLM

log = logging.getLogger("ninfer")

DECODE_STEPS = 4  # tokens generated: the first from the prompt, then decode steps (and verifications)


def warm_up(llm: LLM) -> None:
    """Run the warm-up request (see the module), then reset what it left; a no-op when the pool or the
    context cannot hold even a short prompt."""
    config, sched = llm.engine_config, llm.scheduler
    room = min(llm.max_context, sched.block_pool.num_blocks * config.block_size) - DECODE_STEPS - 1
    length = min(2 * config.prefill_chunk + 3, room)
    if length < 1:
        return
    started = time.monotonic()
    params = (
        POOLED
        if llm.text_refusal
        else SamplingParams(max_tokens=DECODE_STEPS, temperature=1.0, seed=0, ignore_eos=True)
    )
    (out,) = llm.generate(prompt_token_ids=[[_plain_token(llm)] * length], sampling_params=params)
    if out.finish_reason == "error":  # e.g. out of memory in a prompt chunk: said before serving, not after
        raise NinferError(
            f"the start-up warm-up ({length} prompt tokens in chunks of {config.prefill_chunk}) failed: "
            f"{out.error}; a smaller --prefill-chunk or --kv-capacity leaves more memory for a step"
        )
    llm.step()  # an empty step hands the finished request to the runner (its seed forgotten) before ids restart
    llm.reset_prefix_cache()
    sched.reset_counters()
    llm._ids = itertools.count()
    log.info(
        "warm-up: %d prompt tokens and %d decode steps in %.1f s",
        length,
        DECODE_STEPS,
        time.monotonic() - started,
    )


def _plain_token(llm: LLM) -> int:
    """A token of plain text (no special token, image placeholder or end of text)."""
    if llm.tokenizer is not None:
        ids = llm.tokenizer.encode(" the")
        if ids:
            return ids[-1]
    return min(100, llm.model_config.vocab_size - 1)
