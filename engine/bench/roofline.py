"""Roofline: what share of the device's peak a measured rate reaches.

decode % = bytes one decode step reads per token (weights + the KV at that context) x tg / peak bandwidth
prefill % = FLOPs per prompt token (2 x matmul weights + causal attention at that context) x pp / peak FLOP/s
A mixture of experts multiplies top_k of each layer's experts per token; a decode step of S tokens reads the
experts they route to: with routing spread evenly, a share 1 - (1 - top_k / E)^S of every layer's stack.
With speculative decoding a step gives each stream the tokens its draft had accepted, plus one: the run's
tokens per step (suite.tokens_per_step) divide tg into steps, and its experts are those its verified
tokens route to: every draft with a drafter that drafts each step (mtp, draft), else (ngram, whose drafts
come and go) those it gives, at least. A step also runs its drafter once a draft token
(spec mtp: the MTP layer and the head it drafts through, the whole lm_head or --lm-head-draft's rows; spec
draft: the draft model), each pass reading those weights and its KV at that context: with Qwen3.5-27B's
whole head three drafts read about a fifth as much again as the model's own step. (Over HTTP the server's
drafter is not known: not counted.)
Peaks (dense, no sparsity; the 16-bit tensor rate with fp32 accumulate) from a table by GPU name, or given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.config import ModelConfig
from engine.memory import bytes_per_token_per_layer, kv_bytes_per_token, routed_share

# name fragment (as NVML names the card) -> (bytes/s, dense FP16/BF16 tensor FLOP/s with FP32 accumulate);
# the first fragment the name holds wins, so a variant stands before its family
PEAKS = {
    "H200": (4.8e12, 989e12),
    "H100 PCIe": (2.0e12, 756e12),
    "H100 NVL": (3.9e12, 835e12),
    "H100": (3.35e12, 989e12),  # SXM (NVML: "NVIDIA H100 80GB HBM3")
    "A100-SXM4-40GB": (1.555e12, 312e12),
    "A100-PCIE-40GB": (1.555e12, 312e12),
    "A100 80GB PCIe": (1.935e12, 312e12),
    "A100": (2.039e12, 312e12),  # SXM4 80GB
    "L40S": (0.864e12, 362e12),
    "RTX 6000 Ada": (0.96e12, 364.2e12),
    "RTX A6000": (0.768e12, 154.8e12),
    "A10": (0.6e12, 125e12),
    "L4": (0.3e12, 121e12),
    "RTX 5090": (1.792e12, 209.5e12),
    "RTX 4090": (1.008e12, 165.2e12),
    "RTX 3090 Ti": (1.008e12, 80e12),
    "RTX 3090": (0.936e12, 71e12),
}


@dataclass(frozen=True)
class Peaks:
    bandwidth: float | None  # bytes/s
    flops: float | None  # FLOP/s
    source: str


def peaks_for(gpu_name: str | None, bandwidth: float | None = None, flops: float | None = None) -> Peaks:
    """The table's entry for `gpu_name`, each value overridable (--peak-bw, --peak-tflops)."""
    known = next((v for k, v in PEAKS.items() if gpu_name and _names(gpu_name, k)), (None, None))
    source = "given" if bandwidth or flops else (f"table: {gpu_name}" if known[0] else "unknown")
    return Peaks(bandwidth or known[0], flops or known[1], source)


def _names(gpu_name: str, fragment: str) -> bool:
    """Whether `fragment` stands in `gpu_name` as whole words ("A10" is not in "A10G" or "A100")."""
    return re.search(rf"(?<![a-z0-9]){re.escape(fragment)}(?![a-z0-9])", gpu_name, re.IGNORECASE) is not None


@dataclass(frozen=True)
class DrafterCost:
    """What speculative decoding's drafter reads a decode step: `passes` passes (one a draft token), each of
    one token a stream through `weight_bytes` (and the share of `expert_bytes` those tokens route to, by
    `config`'s routing) and `kv_per_token` bytes of KV a stream's context token."""

    config: ModelConfig
    passes: int
    weight_bytes: int
    kv_per_token: int
    expert_bytes: int = 0

    def step_bytes(self, context: int, streams: int) -> float:
        experts = self.expert_bytes * routed_share(self.config, streams)
        return self.passes * (self.weight_bytes + experts + streams * context * self.kv_per_token)


@dataclass(frozen=True)
class ModelCost:
    config: ModelConfig
    weight_bytes: int  # as the engine reads them every decode step (a mixture of experts' stacks apart)
    matmul_weights: int  # weights multiplied per token (no embedding lookup; top_k experts of a layer)
    kv_dtype: str
    expert_bytes: int = 0  # every expert of every layer, as held: a step reads the share its tokens route to
    drafter: DrafterCost | None = None  # speculative decoding's drafter, run each step (not with ngram)

    def decode_bytes(self, context: int, streams: int = 1, tokens: float | None = None) -> float:
        """Bytes one decode step reads: the weights once, the experts its tokens (one a stream unless given)
        route to, and the KV of every stream; and the drafter's passes."""
        experts = self.expert_bytes * routed_share(self.config, streams if tokens is None else tokens)
        drafts = self.drafter.step_bytes(context, streams) if self.drafter is not None else 0
        return (
            self.weight_bytes
            + experts
            + streams * context * kv_bytes_per_token(self.config, self.kv_dtype)
            + drafts
        )

    def prefill_flops(self, context: int) -> float:
        c = self.config
        attention = 4 * (context / 2) * c.num_attention_heads * c.head_dim * c.num_full_attention_layers
        return 2 * self.matmul_weights + attention


def roofline(
    cost: ModelCost | None,
    peaks: Peaks,
    context: int,
    pp: float,
    tg: float,
    streams: int = 1,
    tokens_per_step: float = 1.0,
) -> dict:
    """tg: tokens/s over all `streams`; each stream's decode step gives `tokens_per_step` tokens (1; more
    with speculative decoding, whose step reads the weights once for a draft's accepted tokens)."""
    if cost is None:
        return {"decode_pct": None, "prefill_pct": None}
    steps = tg / (streams * tokens_per_step)
    # the tokens a step routes through the experts: those it gives, or with a drafter every draft it verifies
    routed = streams * max(tokens_per_step, 1 + cost.drafter.passes if cost.drafter is not None else 0)
    decode = (
        cost.decode_bytes(context, streams, routed) * steps / peaks.bandwidth * 100
        if peaks.bandwidth and tg
        else None
    )
    prefill = cost.prefill_flops(context) * pp / peaks.flops * 100 if peaks.flops and pp else None
    return {"decode_pct": decode, "prefill_pct": prefill}


def matmul_weights(config: ModelConfig) -> int:
    """Weights multiplied per token: every matrix but the embedding lookup (a tied head counts once), and
    top_k of each layer's experts."""
    from engine.plan.shapes import model_tensors
    from engine.plan.weights import is_expert_stack

    total = 0
    for name, shape in model_tensors(config):
        if len(shape) == 2 and "embed_tokens" not in name:
            total += shape[0] * shape[1]
        elif is_expert_stack(name, shape):
            total += config.num_experts_per_tok * shape[1] * shape[2]
    if config.tie_word_embeddings:
        total += config.vocab_size * config.hidden_size
    return total


def cost_of_llm(llm) -> ModelCost:
    """The loaded engine's own bytes per decode step: its parameters and packed weights, as they sit (a mixture
    of experts' stacks, dense or packed, apart; a vision tower not); and its drafter's (_drafter)."""
    model = llm.model
    # a vision tower (--vision) runs on pictures, not decode steps; the MTP head and the draft head are the
    # drafter's
    apart = [getattr(model, name, None) for name in ("visual", "mtp", "draft_head")]
    skipped = {id(m) for part in apart if part is not None for m in part.modules()}
    weight_bytes, expert_bytes = _forward_bytes(model, [m for m in model.modules() if id(m) not in skipped])
    cfg, kv_dtype = llm.model_config, llm.engine_config.kv_dtype
    return ModelCost(cfg, weight_bytes, matmul_weights(cfg), kv_dtype, expert_bytes, _drafter(llm, kv_dtype))


def _drafter(llm, kv_dtype: str) -> DrafterCost | None:
    """spec mtp: a pass reads the MTP head's fc and norms, one of its layers (they take turns) and the head
    it drafts through; spec draft: the draft model's step. ngram drafts read nothing."""
    config, passes = llm.engine_config, llm.engine_config.num_draft_tokens
    model = llm.model
    if config.spec == "mtp" and getattr(model, "mtp", None) is not None:
        layers = list(model.mtp.layers)
        in_layers = {id(m) for layer in layers for m in layer.modules()}
        rest, _ = _module_bytes([m for m in model.mtp.modules() if id(m) not in in_layers], set())
        weights, experts = _module_bytes([m for layer in layers for m in layer.modules()], set())
        head = model.draft_head if model.draft_head is not None else model.lm_head
        head_bytes, _ = _module_bytes(list(head.modules()), set())
        mc = llm.model_config
        per_layer = bytes_per_token_per_layer(kv_dtype, mc.num_key_value_heads, mc.head_dim)
        return DrafterCost(
            mc, passes, rest + weights // len(layers) + head_bytes, per_layer, experts // len(layers)
        )
    draft = getattr(llm, "draft_model", None)
    if config.spec == "draft" and draft is not None:
        weights, experts = _forward_bytes(draft, list(draft.modules()))
        return DrafterCost(draft.config, passes, weights, kv_bytes_per_token(draft.config, kv_dtype), experts)
    return None


def _forward_bytes(model, modules: list) -> tuple[int, int]:
    """(weights, expert stacks) bytes a forward of `model` reads of `modules` (its own, or some of them): the
    embedding table is looked up a row a token, not streamed, unless a tied head streams it."""
    weight_bytes, expert_bytes = _module_bytes(modules, set())
    embed, head = model.model.embed_tokens, model.lm_head
    if embed.qweight is not None:  # a packed table (CUDA .ninfer); a tied head shares it
        table_bytes, tied = embed.qweight.nbytes, head.qweight is embed.qweight
    else:
        table = embed.weight
        table_bytes, tied = (
            table.numel() * table.element_size(),
            head.qweight is None and head.weight is table,
        )
    if not tied:  # the embedding is looked up (one row per token); a tied head streams the table itself
        weight_bytes -= table_bytes
    return max(weight_bytes, 0), expert_bytes


def _module_bytes(modules: list, seen: set[int]) -> tuple[int, int]:
    """(weights, expert stacks) bytes held by `modules`' own parameters and packed weights, each once (`seen`:
    ids counted already, added to): a mixture of experts' stacks, dense or packed, apart."""
    from engine.layers.moe import Experts

    weight_bytes = expert_bytes = 0
    for module in modules:
        if isinstance(module, Experts):
            for p in (module.gate_up_proj, module.down_proj):
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    expert_bytes += p.numel() * p.element_size()
            expert_bytes += sum(stack.nbytes for stack in module.packed.values())
    for module in modules:
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                weight_bytes += p.numel() * p.element_size()
        q = getattr(module, "qweight", None)
        if q is not None and id(q) not in seen:
            seen.add(id(q))
            weight_bytes += q.nbytes
    return weight_bytes, expert_bytes
