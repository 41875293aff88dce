"""The KV pool at engine start-up, from the same ledger as `ninfer plan`, against the memory free once the
weights are loaded. A pool that does not fit is refused before anything is allocated, with three ways out.

kv_capacity:
* an int: that many tokens, checked;
* None (the LLM() default): room for min(max_concurrency, 2) full contexts, checked;
* "auto" (`serve`'s default): on CUDA, the pool fills what is free beside the runtime reserves (state,
  activations, graphs, margin), up to every running request at full context; max_context, when not given,
  becomes what the pool holds (at most the model's positions). On the CPU, as None.
"""

from __future__ import annotations

import logging

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import NinferError
from engine.memory import CUDA_CONTEXT_BYTES, LIBRARY_WORKSPACE_BYTES, Deployment
from engine.plan.solver import (
    SERVE_FLAGS,
    Budget,
    Device,
    fits,
    max_pool_tokens,
    needed,
    suggestions,
    usable_kv_dtypes,
)

log = logging.getLogger("ninfer")
GIB = 1 << 30


def device_memory(device: str) -> tuple[int, int]:
    """(total, free) bytes of the device the engine runs on (host RAM for the CPU)."""
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return total, free
    import psutil

    vm = psutil.virtual_memory()
    return vm.total, vm.available


def _device(device: str, total: int) -> Device:
    """For the suggestions: the compute capability decides whether fp8 KV is one of them."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return Device(device, total, torch.cuda.get_device_capability(torch.device(device)))
    return Device(device, total)


def deployment(
    config: EngineConfig,
    model_config: ModelConfig,
    context: int,
    packed_weights: bool = False,
    draft: ModelConfig | None = None,
) -> Deployment:
    """The ledger's view of an engine configuration (packed_weights: the loaded model multiplies 4/6/8-bit
    matrices as they are stored; draft: spec draft's draft model)."""
    return Deployment(
        model_config,
        config.kv_dtype,
        context,
        concurrency=config.max_concurrency,
        packed_weights=packed_weights,
        prefill_chunk=config.prefill_chunk,
        state_snapshots=config.num_state_snapshots,
        dtype_bytes=config.torch_dtype.itemsize,
        block_size=config.block_size,
        device=config.device,
        spec=config.spec,
        draft_tokens=config.num_draft_tokens,
        int8_prefill=config.int8_prefill,
        vision=config.vision,
        lora_graphs=bool(config.lora_modules) and config.cuda_graphs,
        draft=draft,
    )


def size_kv_pool(
    config: EngineConfig,
    model_config: ModelConfig,
    packed_weights: bool = False,
    draft: ModelConfig | None = None,
) -> tuple[int, int]:
    """(max_context, KV pool tokens) for this engine; NinferError (with three ways out) when it does not fit.
    `draft`: spec draft's draft model, loaded already (its weights are out of the free memory; its KV takes
    pool pages)."""
    limit = model_config.position_limit
    given_context = config.max_context
    context = config.resolved_max_context(model_config)
    dep = deployment(config, model_config, context, packed_weights, draft)
    total, free = device_memory(config.device)
    utilization = config.gpu_memory_utilization if config.device.startswith("cuda") else None
    if utilization is not None:
        held = (
            torch.cuda.memory_reserved(torch.device(config.device))
            + CUDA_CONTEXT_BYTES
            + LIBRARY_WORKSPACE_BYTES
        )
        free = within_utilization(total, free, held, utilization)
    budget = Budget.after_load(total, free)
    auto_cuda = config.kv_capacity == "auto" and config.device.startswith("cuda")
    if auto_cuda:
        full = (given_context or limit) * config.max_concurrency
        pool = min(max_pool_tokens(dep.with_(context=given_context or limit), budget), full)
        if given_context is None:
            context = min(limit, pool)
            if context < limit:
                log.info(
                    "max context %d (what the KV pool holds; the model has %d positions): set --max-context "
                    "and --kv-capacity to choose",
                    context,
                    limit,
                )
        dep = dep.with_(context=context, kv_capacity=pool)
        if pool >= max(context, config.block_size):
            return context, pool
    else:
        pool = config.resolved_kv_capacity(model_config)
        if pool < context:  # a --kv-capacity below the model's positions (below --max-context: refused)
            context = pool
            log.info(
                "max context %d (what --kv-capacity holds; the model has %d positions): set --max-context to "
                "choose",
                context,
                limit,
            )
        dep = dep.with_(context=context, kv_capacity=pool)
        if fits(dep, budget):
            return context, dep.pool_tokens
    raise _refusal(dep, budget, config)


def _within(config: EngineConfig) -> str:
    f = config.gpu_memory_utilization
    return (
        f" within --gpu-memory-utilization {f:g}"
        if f is not None and config.device.startswith("cuda")
        else ""
    )


def within_utilization(total: int, free: int, held: int, utilization: float) -> int:
    """The memory this engine may still take under --gpu-memory-utilization: its share of the device less
    what it holds already (weights, CUDA context), and never more than is free."""
    return max(0, min(free, int(utilization * total) - held))


def _refusal(dep: Deployment, budget: Budget, config: EngineConfig) -> NinferError:
    want = dep.with_(kv_capacity=max(dep.pool_tokens, dep.context))
    reserve = needed(want.with_(kv_capacity=0), budget)
    ways = suggestions(
        want, budget, usable_kv_dtypes(want, _device(config.device, budget.device_total)), SERVE_FLAGS
    )
    ways_text = "; ".join(s.text for s in ways) or "use a smaller model or a bigger device"
    return NinferError(
        f"a KV pool of {want.pool_tokens:,} tokens ({want.kv_dtype}) does not fit: it needs "
        f"{(needed(want, budget) - reserve) / GIB:.2f} GiB, and {budget.available / GIB:.2f} GiB is free after "
        f"the weights{_within(config)}, of which {reserve / GIB:.2f} GiB is the runtime reserve (state, activations, margin). "
        f"Ways out: {ways_text}"
    )
