"""The solver over the ledger: the largest context that fits, the frontier (KV dtype x concurrency), the
best configuration for a target, and refusals that carry three ways out, each checked to fit.

Preference (docs/memory.md): context first, then concurrency, then decode speed — the bytes a decode step
reads (weights + the KV of the running requests); dtypes within SPEED_TIE of the fastest count as equally
fast, and the most precise of them wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import NinferError
from engine.memory import (
    CUDA_CONTEXT,
    CUDA_CONTEXT_BYTES,
    WEIGHTS,
    Deployment,
    ledger,
    pool_bytes_per_token,
    routed_share,
)
from engine.plan.weights import recipe_weight_bytes
from engine.rope_scaling import positions_phrase, stretch_hint

PLAN_KV_DTYPES = ("bf16", "fp16", "fp8", "int8", "k8v4")  # most precise first
SPEED_TIE = 0.03
MIN_PREFILL_CHUNK = 512


@dataclass(frozen=True)
class Device:
    name: str
    total_bytes: int
    sm: tuple[int, int] | None = None  # compute capability; None: unknown (nothing excluded for it)


@dataclass(frozen=True)
class Budget:
    """What must fit where: the whole ledger in the device (plan), or what is still to be allocated in
    the memory free right now (serve, after the weights loaded and the CUDA context exists)."""

    device_total: int
    available: int
    excluded: tuple[str, ...] = ()

    @staticmethod
    def whole(device: Device) -> Budget:
        return Budget(device.total_bytes, device.total_bytes)

    @staticmethod
    def after_load(device_total: int, free: int) -> Budget:
        return Budget(device_total, free, (WEIGHTS, CUDA_CONTEXT))


@dataclass(frozen=True)
class Suggestion:
    text: str  # what to change, in words
    deployment: Deployment


class PlanRefusal(NinferError):
    def __init__(self, message: str, suggestions: list[Suggestion]):
        super().__init__(message)
        self.suggestions = suggestions


def kv_unavailable(kv: str, dep: Deployment, device: Device) -> str | None:
    """Why a KV dtype cannot run here, or None."""
    if kv == "fp8" and device.sm is not None and device.sm < (8, 9):
        return f"fp8 KV needs compute capability 8.9 or newer (SM89+); this GPU is SM{device.sm[0]}{device.sm[1]}"
    if kv == "k8v4" and dep.config.head_dim % 32:
        return f"k8v4 needs a head_dim divisible by 32 (this model: {dep.config.head_dim})"
    return None


def needed(dep: Deployment, budget: Budget) -> int:
    return ledger(dep, budget.device_total).without(*budget.excluded)


def fits(dep: Deployment, budget: Budget) -> bool:
    return needed(dep, budget) <= budget.available


def max_pool_tokens(dep: Deployment, budget: Budget) -> int:
    """The most KV pool tokens (whole pages) that fit beside everything else; 0 when not one page does."""
    fixed = needed(dep.with_(kv_capacity=0), budget)
    per_token = pool_bytes_per_token(dep)
    tokens = max(0, budget.available - fixed) // per_token // dep.block_size * dep.block_size
    return tokens


def max_context(dep: Deployment, budget: Budget) -> int:
    """The longest context (pool = context) that fits, at most the model's positions; 0 when none does."""
    limit = dep.config.position_limit // dep.block_size * dep.block_size
    ctx = min(max_pool_tokens(dep.with_(context=limit), budget), limit)
    return ctx if ctx >= dep.block_size else 0


def frontier(dep: Deployment, device: Device, concurrencies=(1, 2, 3, 4)) -> dict[str, dict[int, int | str]]:
    """Max context per KV dtype x concurrency (or the reason the dtype is excluded)."""
    budget = Budget.whole(device)
    table: dict[str, dict[int, int | str]] = {}
    for kv in PLAN_KV_DTYPES:
        reason = kv_unavailable(kv, dep, device)
        table[kv] = {
            c: reason or max_context(dep.with_(kv_dtype=kv, concurrency=c, kv_capacity=None), budget)
            for c in concurrencies
        }
    return table


def decode_bytes(dep: Deployment) -> float:
    """Bytes one decode step reads: the weights (of a mixture of experts, the share its requests' tokens
    route to) and the KV of every running request at full context."""
    experts = dep.weights.get("experts", 0)
    weights = sum(dep.weights.values()) - experts + experts * routed_share(dep.config, dep.concurrency)
    return weights + dep.concurrency * dep.context * pool_bytes_per_token(dep)


MAX_PLANNED_CONCURRENCY = 4


def solve_any_concurrency(dep: Deployment, device: Device, context: int, kv_dtype: str | None) -> Deployment:
    """A target context without a concurrency: the most running requests (up to 4) that reach it."""
    for c in range(MAX_PLANNED_CONCURRENCY, 1, -1):
        try:
            return solve(dep.with_(concurrency=c), device, context, kv_dtype)
        except PlanRefusal:
            continue
    return solve(dep.with_(concurrency=1), device, context, kv_dtype)


def solve(dep: Deployment, device: Device, context: int | None, kv_dtype: str | None) -> Deployment:
    """The best deployment at dep.concurrency for a target context (None: as long as fits) and KV dtype
    (None: chosen). Raises PlanRefusal with three suggestions when the target does not fit, NinferError
    when it is past the model's own context limit (no memory makes that fit)."""
    limit = dep.config.position_limit // dep.block_size * dep.block_size
    if context is not None and context > limit:
        scaling, positions = dep.config.rope_scaling, dep.config.max_position_embeddings
        raise NinferError(
            f"{context:,} tokens of context is past this model's {positions_phrase(scaling, positions)}; use "
            f"--context {limit} or less{stretch_hint(context, scaling, positions)}"
        )
    budget = Budget.whole(device)
    if kv_dtype is not None:
        reason = kv_unavailable(kv_dtype, dep, device)
        if reason:
            others = [k for k in PLAN_KV_DTYPES if k != kv_dtype and not kv_unavailable(k, dep, device)]
            raise NinferError(f"{reason}; use --kv-dtype {' or '.join(others[-2:])}")
    choices = []
    for kv in [kv_dtype] if kv_dtype else PLAN_KV_DTYPES:
        if kv_unavailable(kv, dep, device):
            continue
        trial = dep.with_(kv_dtype=kv, kv_capacity=None)
        reach = max_context(trial, budget)
        if reach and (context is None or reach >= context):
            choices.append(trial.with_(context=context or reach))
    if not choices:
        raise _refusal(dep, device, context, kv_dtype)
    longest = max(c.context for c in choices)
    choices = [c for c in choices if c.context == longest]
    fastest = min(decode_bytes(c) for c in choices)
    choices = [c for c in choices if decode_bytes(c) <= fastest * (1 + SPEED_TIE)]
    return with_spare_pool(min(choices, key=lambda c: PLAN_KV_DTYPES.index(c.kv_dtype)), budget)


def with_spare_pool(dep: Deployment, budget: Budget) -> Deployment:
    """`dep` (its pool one context, the frontier's measure) with the pool grown into the memory it leaves,
    up to a full context for each running request, as serve's --kv-capacity auto sizes it: where the
    context stops at the model's positions, running requests need not share one context's pages, and the
    prefix cache keeps more."""
    full = dep.context * dep.concurrency
    pool = min(max_pool_tokens(dep, budget), full // dep.block_size * dep.block_size)
    return dep.with_(kv_capacity=pool) if pool > dep.pool_tokens else dep


@dataclass(frozen=True)
class Flags:
    """How the suggestions name the knobs: plan's flags, or serve's."""

    context: str = "--context"
    concurrency: str = "--concurrency"
    kv_dtype: str = "--kv-dtype"


SERVE_FLAGS = Flags("--kv-capacity", "--max-concurrency", "--kv-dtype")


def usable_kv_dtypes(dep: Deployment, device: Device) -> list[str]:
    return [k for k in PLAN_KV_DTYPES if not kv_unavailable(k, dep, device)]


def _refusal(dep: Deployment, device: Device, context: int | None, kv_dtype: str | None) -> PlanRefusal:
    budget = Budget.whole(device)
    usable = usable_kv_dtypes(dep, device)
    # the KV dtype that reaches furthest; where none reaches anywhere, the smallest (what comes closest)
    kv = kv_dtype or max(
        usable, key=lambda k: (max_context(dep.with_(kv_dtype=k), budget), -_kv_size(dep, k))
    )
    want = dep.with_(kv_dtype=kv, context=context or dep.block_size, kv_capacity=None)
    gib = 1 << 30
    message = (
        f"{want.context:,} tokens of context at concurrency {want.concurrency} with {kv} KV needs "
        f"{needed(want, budget) / gib:.2f} GiB; {device.name} has {device.total_bytes / gib:.2f} GiB"
    )
    ways = suggestions(want, budget, usable, Flags())
    if not ways:
        weights = sum(want.weights.values())
        message += f"; the weights alone take {weights / gib:.2f} GiB: " + _fewer_bits(want, device, weights)
    return PlanRefusal(message, ways)


def _fewer_bits(want: Deployment, device: Device, weights: int) -> str:
    """The way out when the weights do not fit: 4-bit weights where they would leave room, else a bigger
    GPU (a 4-bit recipe that is no smaller, or still too big, is not offered)."""
    gib = 1 << 30
    four = sum(
        recipe_weight_bytes(want.config, "w4g128", mtp=want.spec == "mtp", vision=want.vision).values()
    ) + want.weights.get("draft model", 0)
    if four < weights and four + CUDA_CONTEXT_BYTES < device.total_bytes:
        return f"fewer bits per weight (--recipe w4g128: {four / gib:.2f} GiB, or --bits 4) or a bigger GPU"
    return f"even at 4 bits per weight (w4g128) they take {four / gib:.2f} GiB; a bigger GPU"


def suggestions(want: Deployment, budget: Budget, usable: list[str], flags: Flags) -> list[Suggestion]:
    """Up to three changes to `want` that fit `budget`: a smaller pool / context, fewer running requests,
    a smaller KV dtype (then, where one of those is impossible: no vision, no speculation, smaller steps)."""
    out: list[Suggestion] = []
    # a change that only fits after cutting the context / pool is offered when it keeps more than the cut alone
    floor = max_context(want, budget) if want.kv_capacity is None else max_pool_tokens(want, budget)
    if want.kv_capacity is None:  # plan: the pool is the context
        ctx = floor
        if ctx:
            out.append(Suggestion(f"a shorter context: {flags.context} {ctx}", want.with_(context=ctx)))
    else:
        pool = floor
        if pool:
            out.append(
                Suggestion(
                    f"a smaller KV pool: {flags.context} {pool}",
                    want.with_(kv_capacity=pool, context=min(want.context, pool)),
                )
            )
    for c in range(want.concurrency - 1, 0, -1):
        if fits(want.with_(concurrency=c), budget):
            out.append(
                Suggestion(f"fewer running requests: {flags.concurrency} {c}", want.with_(concurrency=c))
            )
            break
    else:  # no lower concurrency holds the whole target: one request, with what it does reach
        if want.concurrency > 1:
            out += _shrunk(
                want.with_(concurrency=1),
                budget,
                flags,
                f"fewer running requests: {flags.concurrency} 1",
                floor,
            )
    smaller = [k for k in usable if _kv_size(want, k) < _kv_size(want, want.kv_dtype)]
    for k in smaller:  # the most precise smaller dtype that holds the whole target
        if fits(want.with_(kv_dtype=k), budget):
            out.append(Suggestion(f"a smaller KV dtype: {flags.kv_dtype} {k}", want.with_(kv_dtype=k)))
            break
    else:
        for k in reversed(smaller):  # none does: the smallest, with what it does reach
            found = _shrunk(
                want.with_(kv_dtype=k), budget, flags, f"a smaller KV dtype: {flags.kv_dtype} {k}", floor
            )
            if found:
                out += found
                break
    fallbacks = [
        ("without the vision tower: drop --vision", want.with_(vision=False), want.vision),
        (
            "without speculative decoding: --spec none",
            want.with_(spec="none", draft_tokens=0),
            want.spec != "none",
        ),
        (
            f"smaller prefill steps: --prefill-chunk {MIN_PREFILL_CHUNK}",
            want.with_(prefill_chunk=MIN_PREFILL_CHUNK),
            want.prefill_chunk > MIN_PREFILL_CHUNK,
        ),
    ]
    fallbacks += [
        (f"fewer running requests: {flags.concurrency} {c}", want.with_(concurrency=c), True)
        for c in range(want.concurrency - 1, 1, -1)
    ]
    for text, dep, applies in fallbacks:  # whole target first, then with what each reaches
        if len(out) < 3 and applies and fits(dep, budget):
            out.append(Suggestion(text, dep))
    for text, dep, applies in fallbacks:
        if len(out) < 3 and applies and not fits(dep, budget):
            out += _shrunk(dep, budget, flags, text, floor)
    return out[:3]


def _shrunk(trial: Deployment, budget: Budget, flags: Flags, text: str, floor: int) -> list[Suggestion]:
    """`trial` with its context (plan) or pool (serve) cut to what fits; [] unless that keeps more than
    `floor` tokens."""
    if trial.kv_capacity is None:
        tokens = max_context(trial, budget)
        changed = trial.with_(context=tokens)
    else:
        tokens = max_pool_tokens(trial, budget)
        changed = trial.with_(kv_capacity=tokens, context=min(trial.context, tokens))
    return [Suggestion(f"{text} {flags.context} {tokens}", changed)] if tokens > floor else []


def _kv_size(dep: Deployment, kv: str) -> int:
    return pool_bytes_per_token(dep, kv)
