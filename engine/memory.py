"""The VRAM ledger: every byte a deployment needs, by component. `ninfer plan` and `serve --kv-capacity
auto` both size from it. Formulas and constants: docs/memory.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from engine.cache.kv_layout import bytes_per_token_per_layer
from engine.cache.state_pool import HOST_SNAPSHOTS_PER_SLOT
from engine.config import MAX_DRAFT_TOKENS, ModelConfig
from engine.errors import NinferError
from engine.plan.shapes import vision_patch_width
from engine.vision.config import MAX_IMAGE_PATCHES
from engine.worker.prompt_logprobs import ROWS as PROMPT_LOGPROB_ROWS
from ninfer_kernels.paged_attention import num_decode_splits
from ninfer_kernels.quant_matmul import DEQUANT_MIN_M, DEQUANT_SCRATCH_BYTES

MIB, GIB = 1 << 20, 1 << 30
CUDA_CONTEXT_BYTES = 512 * MIB  # driver context + the kernels torch and Triton load (lazy module loading)
# cuBLAS / cuBLASLt workspaces of the matmuls torch still runs, and the split-K GEMVs' partial-sum buffers
# (kernels/quant_matmul/triton.split_buffers: 16 fp32 rows per projection width, ~1-2 MiB each at 27B)
LIBRARY_WORKSPACE_BYTES = 64 * MIB
MARGIN_FRACTION, MIN_MARGIN_BYTES = 0.02, 256 * MIB  # allocator fragmentation, stray tensors
GRAPH_OVERHEAD_BYTES = 2 * MIB  # per captured decode graph (its static inputs and bookkeeping)
# the largest image encoded at once: 2048 x 2048 pixels at patch 16 (larger ones are scaled down to it)
VISION_MAX_PATCHES = MAX_IMAGE_PATCHES
LOGIT_COPIES = 3  # fp32 logits, probabilities, and the sorted copy top-p / top-k work on
SPECS = ("none", "mtp", "ngram", "draft")

WEIGHTS, KV_POOL, CUDA_CONTEXT = "weights", "KV pool", "CUDA context + workspaces"


@dataclass(frozen=True)
class Deployment:
    """One configuration to account for. `weights` holds bytes per tensor kind as the engine keeps them."""

    config: ModelConfig
    kv_dtype: str
    context: int  # tokens one request may reach (--max-context)
    concurrency: int = 1  # requests running at once (--max-concurrency)
    kv_capacity: int | None = None  # KV pool tokens shared by the running requests; None: the context
    weights: dict[str, int] = field(default_factory=dict, compare=False)
    packed_weights: bool = False  # 4/6/8-bit matrices multiplied packed (a quantized recipe on a GPU)
    prefill_chunk: int = 2048
    spec: str = "none"
    draft_tokens: int = 0
    vision: bool = False
    lora_graphs: bool = False  # LoRA adapters at start-up: a second set of decode graphs carries their lanes
    int8_prefill: bool = False  # prompt chunks multiply int8 activations (packed weights on a GPU)
    state_snapshots: int | None = None  # None: 2 x concurrency + 2, the engine's default
    dtype_bytes: int = 2
    block_size: int = 16
    device: str = "cuda"
    # spec draft: the draft model, whose KV shares the pool's pages (its weights are measured as loaded)
    draft: ModelConfig | None = field(default=None, compare=False)

    def with_(self, **changes) -> Deployment:
        return replace(self, **changes)

    @property
    def pool_tokens(self) -> int:
        tokens = self.kv_capacity if self.kv_capacity is not None else self.context
        return math.ceil(tokens / self.block_size) * self.block_size

    @property
    def hybrid(self) -> bool:
        return self.config.num_linear_attention_layers > 0

    @property
    def num_snapshots(self) -> int:
        if not self.hybrid:
            return 0
        return 2 * self.concurrency + 2 if self.state_snapshots is None else self.state_snapshots

    @property
    def decode_tokens(self) -> int:
        """Query tokens per running request in a decode step: 1, or the draft plus the bonus token."""
        return 1 + (self.draft_tokens if self.spec != "none" else 0)


@dataclass(frozen=True)
class Row:
    component: str
    bytes: int
    detail: str


@dataclass(frozen=True)
class Ledger:
    rows: tuple[Row, ...]

    @property
    def total(self) -> int:
        return sum(r.bytes for r in self.rows)

    def get(self, component: str) -> int:
        return sum(r.bytes for r in self.rows if r.component == component)

    def without(self, *prefixes: str) -> int:
        """The total less the rows whose component starts with any of `prefixes`."""
        return sum(r.bytes for r in self.rows if not r.component.startswith(prefixes))


def kv_layers(config: ModelConfig, spec: str = "none") -> int:
    """Layers that keep KV: the full-attention ones, plus the MTP layers when they draft."""
    return config.num_full_attention_layers + (config.mtp_num_hidden_layers if spec == "mtp" else 0)


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str, spec: str = "none") -> int:
    per_layer = bytes_per_token_per_layer(kv_dtype, config.num_key_value_heads, config.head_dim)
    return kv_layers(config, spec) * per_layer


def routed_share(config: ModelConfig, tokens: float) -> float:
    """The expected share of a mixture of experts' layer that `tokens` tokens route to (top_k experts each,
    routing spread evenly): what a decode step of that many tokens reads of its expert stacks (1 without)."""
    if not config.num_experts:
        return 1.0
    return 1.0 - (1.0 - config.num_experts_per_tok / config.num_experts) ** max(tokens, 1.0)


def pool_bytes_per_token(dep: Deployment, kv_dtype: str | None = None) -> int:
    """What a KV pool token takes: the model's layers, and with spec draft the draft model's too (its KV
    lives in the same pages)."""
    kv = kv_dtype or dep.kv_dtype
    draft = kv_bytes_per_token(dep.draft, kv) if dep.draft is not None else 0
    return kv_bytes_per_token(dep.config, kv, dep.spec) + draft


def pool_layers(dep: Deployment) -> int:
    return kv_layers(dep.config, dep.spec) + (kv_layers(dep.draft) if dep.draft is not None else 0)


def state_slot_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """One recurrent-state slot: per linear-attention layer, conv_state [conv_dim, K - 1] in the model dtype
    and ssm_state [Hv, Dk, Dv] in fp32 (as the model runner allocates them)."""
    conv_dim = 2 * config.linear_num_key_heads * config.linear_key_head_dim
    conv_dim += config.linear_num_value_heads * config.linear_value_head_dim
    conv = conv_dim * (config.linear_conv_kernel_dim - 1) * dtype_bytes
    ssm = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    return config.num_linear_attention_layers * (conv + ssm)


def activation_bytes_per_token(config: ModelConfig, dtype_bytes: int) -> int:
    """Peak live activations per token of a step, in bytes: hidden + residual, plus the widest layer part."""
    h, heads, kv, d = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    gate = 2 if config.family == "qwen3_5" else 1  # Qwen3.5's q_proj also emits the output gate
    attention = (gate * heads + 2 * kv) * d + heads * d
    mlp = 3 * config.intermediate_size  # gate | up, then silu(gate) * up
    linear = 0
    if config.num_linear_attention_layers:
        key = config.linear_num_key_heads * config.linear_key_head_dim
        value = config.linear_num_value_heads * config.linear_value_head_dim
        conv_dim = 2 * key + value
        projected = conv_dim + value + 2 * config.linear_num_value_heads
        # conv output, then q / k / v and the core output in fp32 for the delta rule
        linear = projected + conv_dim + (conv_dim + value) * 4 // dtype_bytes
    return (2 * h + max(attention, mlp, linear)) * dtype_bytes


def host_state_snapshots(dep: Deployment) -> tuple[int, int]:
    """Host memory beside the ledger: (snapshots, bytes) of the host tier a hybrid model's state snapshots
    are evicted to by default, HOST_SNAPSHOTS_PER_SLOT times the GPU slots (engine/worker/host_kv.py
    host_state_slots); (0, 0) for other models."""
    if not dep.hybrid or not dep.num_snapshots:
        return 0, 0
    n = HOST_SNAPSHOTS_PER_SLOT * dep.num_snapshots
    return n, n * state_slot_bytes(dep.config, dep.dtype_bytes)


def host_cache_shortfall(dep: Deployment) -> tuple[int, int]:
    """(tokens, bytes) of KV the pool lacks for every running request at full context at once (concurrency
    x context - pool): pages one request's turn evicts from another's cached prefix, which a host tier
    (serve --host-cache) of that many bytes keeps to be copied back; (0, 0) where the pool holds them all."""
    tokens = max(0, dep.concurrency * dep.context - dep.pool_tokens) if dep.concurrency > 1 else 0
    return tokens, tokens * pool_bytes_per_token(dep)


def host_cache_size(dep: Deployment) -> int:
    """The --host-cache that holds the shortfall (host_cache_shortfall) beside a hybrid model's default host
    state snapshots (host_state_snapshots; given --host-cache, they would be an eighth of it), in quarters
    of a GiB; 0 where the pool holds every running request's full context."""
    _, kv_bytes = host_cache_shortfall(dep)
    if not kv_bytes:
        return 0
    quarter = GIB // 4
    return -(-(kv_bytes + host_state_snapshots(dep)[1]) // quarter) * quarter


def ledger(dep: Deployment, device_total: int) -> Ledger:
    cfg, b = dep.config, dep.dtype_bytes
    rows = [Row(f"{WEIGHTS}: {kind}", n, "") for kind, n in dep.weights.items() if n]
    per_token = pool_bytes_per_token(dep)
    rows.append(
        Row(
            KV_POOL,
            dep.pool_tokens * per_token,
            f"{dep.pool_tokens:,} tokens x {per_token:,} B ({pool_layers(dep)} layers, {dep.kv_dtype})",
        )
    )
    slot = state_slot_bytes(cfg, b)
    if dep.hybrid:
        rows.append(
            Row("recurrent state", dep.concurrency * slot, f"{dep.concurrency} slots x {slot / MIB:.1f} MiB")
        )
        rows.append(
            Row("state snapshots", dep.num_snapshots * slot, f"{dep.num_snapshots} prefix-cache snapshots")
        )
    # hybrid models back up each running request's state before a step that verifies drafts
    backups = dep.concurrency * slot if dep.hybrid else 0
    if dep.spec in ("mtp", "draft"):
        # the head's (the draft model's) pass over a step's tokens and its chained steps: hidden states, logits
        draft_io = dep.concurrency * dep.decode_tokens * (cfg.vocab_size * 4 + 2 * cfg.hidden_size * b)
        drafter = "the head's" if dep.spec == "mtp" else "the draft model's"
        rows.append(
            Row(
                "draft buffers",
                backups + draft_io,
                f"{dep.spec}, {dep.draft_tokens} draft tokens: state backups + {drafter} hidden states and logits",
            )
        )
    elif dep.spec == "ngram" and dep.hybrid:
        # n-gram drafts need no model run; their logits rows are in the step's activations
        rows.append(
            Row(
                "draft buffers",
                backups,
                f"ngram: {dep.concurrency} x the state before a step (restored when a draft is rejected)",
            )
        )
    positions = cfg.position_limit  # the rope table covers every position the model takes
    rows.append(
        Row("rotary table", positions * cfg.rotary_dim * 4, f"cos | sin of {positions:,} positions, fp32")
    )
    step_tokens = max(dep.prefill_chunk, dep.concurrency * dep.decode_tokens)
    # after a prompt chunk's forward, its prompt log-probabilities (when asked for) take the same room
    act = max(step_tokens * activation_bytes_per_token(cfg, b), 2 * PROMPT_LOGPROB_ROWS * cfg.vocab_size * 4)
    logits = dep.concurrency * dep.decode_tokens * cfg.vocab_size * 4 * LOGIT_COPIES
    rows_q = dep.concurrency * dep.decode_tokens
    partials = (
        rows_q
        * cfg.num_attention_heads
        * num_decode_splits(dep.context, dep.kv_dtype)
        * (cfg.head_dim + 1)
        * 4
    )
    rows.append(Row("activations", act + logits + partials, f"step of {step_tokens:,} tokens + logits"))
    if dep.vision:
        vh, vi = vision_patch_width(cfg)
        rows.append(
            Row("vision activations", VISION_MAX_PATCHES * (6 * vh + vi) * b, f"{VISION_MAX_PATCHES} patches")
        )
    if dep.device.startswith("cuda"):
        rows.append(Row(CUDA_CONTEXT, CUDA_CONTEXT_BYTES + LIBRARY_WORKSPACE_BYTES, "driver context, cuBLAS"))
        if dep.packed_weights and dep.int8_prefill:
            k = max(cfg.hidden_size, cfg.intermediate_size)
            rows.append(
                Row(
                    "int8 activations",
                    int8_activation_bytes(dep.prefill_chunk, k),
                    f"a prompt chunk's int8 codes, scales and sums at {k:,} columns",
                )
            )
        elif dep.packed_weights and dep.prefill_chunk >= DEQUANT_MIN_M:
            rows.append(
                Row(
                    "dequant scratch",
                    DEQUANT_SCRATCH_BYTES,
                    f"weight slices dequantized for cuBLAS in prefill chunks of {DEQUANT_MIN_M}+ tokens",
                )
            )
        # one graph per batch bucket and query count a sequence (1 .. 1 + draft tokens), one shared pool,
        # twice with LoRA adapters (with and without their lanes); with the MTP head, one more per bucket for
        # its chained draft step
        buckets = graph_buckets(dep.concurrency)
        sets = 2 if dep.lora_graphs else 1
        num_graphs = len(buckets) * (sets * dep.decode_tokens + (dep.spec == "mtp"))
        decode_act = dep.concurrency * dep.decode_tokens * activation_bytes_per_token(cfg, b) + logits
        queries = f" x {dep.decode_tokens} query counts" if dep.decode_tokens > 1 else ""
        queries += ", with and without LoRA lanes" if dep.lora_graphs else ""
        rows.append(
            Row(
                "CUDA graph pools",
                decode_act + num_graphs * GRAPH_OVERHEAD_BYTES,
                f"decode graphs for {len(buckets)} batch sizes{queries}",
            )
        )
    margin = max(MIN_MARGIN_BYTES, int(MARGIN_FRACTION * device_total))
    rows.append(Row("safety margin", margin, f"max(256 MiB, {MARGIN_FRACTION:.0%} of the device)"))
    return Ledger(tuple(rows))


def int8_activation_bytes(tokens: int, k: int) -> int:
    """kernels.quantize_act's output for `tokens` rows of k columns: a code a column, and a scale and a sum
    (8 bytes) a group of 32 or more."""
    return tokens * (k + 8 * math.ceil(k / 32))


def graph_buckets(max_batch: int) -> list[int]:
    """Decode batch sizes captured as CUDA graphs: powers of two up to the most requests a step runs."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return [*sizes, max_batch]


def validate(dep: Deployment) -> None:
    if dep.spec == "draft" and dep.draft is None:
        raise NinferError("--spec draft needs --draft-model (a path or preset, e.g. qwen3-0.6b)")
    if dep.spec not in SPECS:
        raise NinferError(f"unknown --spec '{dep.spec}'; use one of {', '.join(SPECS)}")
    if dep.spec == "mtp" and not dep.config.mtp_num_hidden_layers:
        raise NinferError("this model has no MTP head; use --spec ngram or --spec none")
    if dep.spec != "none" and not 1 <= dep.draft_tokens <= MAX_DRAFT_TOKENS:
        raise NinferError(
            f"--spec {dep.spec} takes --draft-tokens 1 to {MAX_DRAFT_TOKENS} (got {dep.draft_tokens}); "
            "3 to 5 suit most replies"
        )
    if dep.int8_prefill and not dep.packed_weights:
        raise NinferError(
            "--int8-prefill multiplies packed 4/6/8-bit weights and these are 16-bit; use a quantized "
            "recipe (e.g. --recipe q4.6) or drop --int8-prefill"
        )
    if dep.vision and not dep.config.vision_config:
        raise NinferError("this model has no vision tower; drop --vision")
    if dep.concurrency < 1 or dep.context < 1:
        raise NinferError("--concurrency and --context must be positive")
    if dep.state_snapshots is not None and dep.state_snapshots < 0:
        raise NinferError(
            f"--state-snapshots is a count of 0 or more (got {dep.state_snapshots}); 0 keeps none, which "
            "leaves a hybrid model's prefix cache nothing to resume from"
        )
