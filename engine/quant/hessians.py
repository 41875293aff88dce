"""Calibration statistics for GPTQ: what each linear weight's output error is measured against.

GPTQ quantizes W [N, K] to minimise sum_t c_t ||(W - Q) x_t||^2 = tr((W - Q) H (W - Q)^T) over the layer's
calibration inputs x_t, with H = sum_t c_t x_t x_t^T [K, K]. Plain GPTQ counts every token once (c_t = 1).
A causal LM does not use its tokens alike: a few keys (a window's first token above all: ~500 of 1,024
queries' worth of softmax weight in the default model's middle layers) receive most of the attention, so an
error in their values reaches nearly every output, while plain statistics count them once. Hence:

* K and V rows of an attention layer's fused projection: c_t = the attention mass token t receives (its
  softmax weights summed over the queries, averaged over the query heads of its KV head), one H per KV
  head ([Hk, K, K]). For V this is the bound ||sum_t p_qt dv_t||^2 <= sum_t p_qt ||dv_t||^2 summed over
  the queries q; K rows take the same weights. Where Hk such matrices per layer do not fit the budget,
  one with the masses averaged over the KV heads.
* the MLP down projection of a layer with softmax attention: the plain and the mass-weighted statistics
  (c_t = that layer's token masses, averaged over its KV heads), each scaled to trace 1, added.

Measured on the default model, w4g128, perplexity over the benchmark's first 8K tokens: plain statistics
+18.0%; V rows weighted +10.8%; and K rows +10.2%; and down projections +9.8%. Weighting the gate/up and
output projections too measured worse (+11.1% / +11.0% against +10.8%), so they keep plain statistics.

The statistics come from running the source model over calibration text with the engine, one window per
forward (`collect_hessians`).
"""

from __future__ import annotations

import importlib
import inspect

import torch

from engine.layers.attention import Attention
from engine.layers.linear import Linear, MergedLinear
from engine.worker.forward_context import get_forward_context

# stdlib modules whose docstrings (with recipes.CALIBRATION_TEXT) make the calibration text: English
# technical prose that ships with every Python, and not the text benchmarks/quant_quality.py scores
CALIBRATION_MODULES = (
    "argparse", "asyncio", "collections", "contextlib", "csv", "dataclasses", "decimal", "difflib",
    "email", "enum", "fractions", "functools", "heapq", "http.server", "inspect", "ipaddress",
    "logging", "pathlib", "pickle", "shutil", "statistics", "string", "subprocess", "tarfile",
    "textwrap", "threading", "typing", "unittest", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip
CALIBRATION_TOKENS = 8192  # the whole calibration text (~6.2K tokens here): q4.6 +5.12% vs +5.84% at 4,096
WINDOW = 1024
MAX_HESSIAN_BYTES = 8 << 30  # above this (big models), round-to-nearest: GPTQ needs every layer's H at once

Key = str | tuple[str, str]  # a parameter name, or (parameter name, shard) for rows with their own H


def calibration_text() -> str:
    from engine.quant.recipes import CALIBRATION_TEXT

    docs = [CALIBRATION_TEXT]
    for name in CALIBRATION_MODULES:
        doc = inspect.getdoc(importlib.import_module(name))
        if doc:
            docs.append(doc)
    return "\n\n".join(docs)


def _attention_blocks(model) -> list[tuple[MergedLinear, Attention, Linear | None]]:
    """(fused q/k/v projection, its softmax attention, the same layer's MLP down projection or None) of
    every softmax-attention layer of `model`."""
    blocks = []
    for layer in model.modules():
        holder = getattr(layer, "self_attn", None)
        qkv, attn = getattr(holder, "qkv_proj", None), getattr(holder, "attn", None)
        if not (isinstance(qkv, MergedLinear) and isinstance(attn, Attention)):
            continue
        if not {"k", "v"} <= set(qkv.offsets):
            continue
        down = getattr(getattr(layer, "mlp", None), "down_proj", None)
        blocks.append((qkv, attn, down if isinstance(down, Linear) else None))
    return blocks


def hessian_bytes(model, per_kv_head: bool = True) -> int:
    """fp32 bytes of every statistic collect_hessians(per_kv_head=...) keeps for `model`."""
    total = sum(m.in_features**2 * 4 for m in model.modules() if isinstance(m, Linear))
    for qkv, attn, down in _attention_blocks(model):
        total += (attn.num_kv_heads if per_kv_head else 1) * qkv.in_features**2 * 4
        if down is not None:
            total += down.in_features**2 * 4
    return total


def attention_mass(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """[Hk, T]: the softmax weight each key receives from the causal queries of one sequence (q [T, Hq, D],
    k [T, Hk, D], positions 0..T-1), summed over the queries and averaged over each KV head's query heads.
    Each query's weights sum to 1, so the masses of a KV head sum to T."""
    t, hq, d = q.shape
    hk = k.shape[1]
    qg = q.float().view(t, hk, hq // hk, d).permute(1, 2, 0, 3)  # [Hk, G, T, D]
    scores = (qg @ k.float().permute(1, 2, 0)[:, None]) * scale  # [Hk, G, T(query), T(key)]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return weights.sum(dim=2).mean(dim=1)  # [Hk, T]


def _accumulate(store: dict, key, x: torch.Tensor, weights: torch.Tensor | None = None) -> None:
    """store[key] += sum_t c_t x_t x_t^T for x [T, K] and token weights c [T] (1 when None)."""
    xw = x if weights is None else x * weights[:, None]
    if key in store:
        store[key].addmm_(xw.t(), x)
    else:
        store[key] = xw.t() @ x


@torch.inference_mode()
def collect_hessians(
    llm, tokens: list[int], window: int = WINDOW, per_kv_head: bool = True
) -> dict[Key, torch.Tensor]:
    """H [K, K] fp32 per linear weight, keyed by its parameter name, over `tokens` run in windows of
    `window` (see the module docstring); the K and V shards of a softmax-attention layer also get
    (name, "k") / (name, "v") -> [Hk, K, K] (one tensor, shared), or [1, K, K] with the token masses
    averaged over the KV heads when not `per_kv_head` (Hk times less memory; default model, 8K tokens,
    K/V/down weighted on an otherwise plain-GPTQ w4g128: +9.5% against +9.3% per head).

    A head tied to the embedding is keyed by the embedding's name: the shared table is quantized for the
    head's inputs (measured on the default model: w4g128 perplexity +57% -> +36%, q4.6 +22.5% -> +6.8%,
    although the lookup then sees error-compensated rather than rounded rows)."""
    from engine.quant.calibration import sequence_logprobs

    model = llm.model
    param_names = {id(p): n for n, p in model.named_parameters()}  # a tied head: the embedding's name
    sums: dict[Key, torch.Tensor] = {}
    hooks = []

    for module in model.modules():
        if isinstance(module, Linear) and module.weight is not None:
            key = param_names[id(module.weight)]

            def hook(mod, args, key=key):
                _accumulate(sums, key, args[0].reshape(-1, args[0].shape[-1]).float())  # x: [T, K]

            hooks.append(module.register_forward_pre_hook(hook))

    weighted: dict[str, torch.Tensor] = {}  # qkv name -> [Hk, K, K] ([1, K, K] not per_kv_head)
    down_weighted: dict[str, torch.Tensor] = {}  # down name -> [K, K]
    for qkv, attn, down in _attention_blocks(model):
        name = param_names[id(qkv.weight)]
        seen: dict[str, torch.Tensor] = {}  # this step's qkv input and the layer's token masses

        def keep_input(mod, args, seen=seen):
            seen["x"] = args[0].reshape(-1, args[0].shape[-1]).float()

        def weigh(mod, args, name=name, seen=seen):
            ctx = get_forward_context()
            one_sequence = ctx.seq_lens.numel() == 1 and int(ctx.seq_lens[0]) == args[0].shape[0]
            assert one_sequence, "attention-weighted statistics need one whole sequence per forward"
            mass = attention_mass(args[0], args[1], mod.scale)  # [Hk, T]
            seen["mass"] = mass.mean(dim=0)  # [T]
            if not per_kv_head:
                mass = seen["mass"][None]  # [1, T]
            x = seen["x"]
            if name not in weighted:
                weighted[name] = torch.zeros(mass.shape[0], x.shape[1], x.shape[1], device=x.device)
            for head in range(mass.shape[0]):
                weighted[name][head].addmm_((x * mass[head][:, None]).t(), x)

        hooks.append(qkv.register_forward_pre_hook(keep_input))
        hooks.append(attn.register_forward_pre_hook(weigh))
        if down is not None:
            down_name = param_names[id(down.weight)]

            def weigh_down(mod, args, down_name=down_name, seen=seen):
                x = args[0].reshape(-1, args[0].shape[-1]).float()
                _accumulate(down_weighted, down_name, x, seen["mass"])

            hooks.append(down.register_forward_pre_hook(weigh_down))
    try:
        for start in range(0, len(tokens), window):
            chunk = tokens[start : start + window]
            if len(chunk) > 1:
                sequence_logprobs(llm, chunk)
    finally:
        for h in hooks:
            h.remove()
    for name, per_head in weighted.items():
        sums[(name, "k")] = sums[(name, "v")] = per_head
    for name, h in down_weighted.items():
        plain = sums[name]
        sums[name] = plain / plain.trace().clamp_min(1e-30) + h / h.trace().clamp_min(1e-30)
    return sums
