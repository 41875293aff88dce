"""`ninfer convert`: an HF checkpoint directory or a GGUF file -> a `.ninfer` container, tensor by tensor."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from engine.errors import NinferError
from engine.formats.container import SUFFIX, write_container
from engine.formats.gguf_mmproj import with_mmproj
from engine.formats.stacked_experts import per_expert
from engine.models.loader import model_path, open_source
from engine.quant.calibration import sequence_logprobs
from engine.quant.groupwise import QuantizedTensor, dequantize, quantize
from engine.quant.hessians import (
    CALIBRATION_TOKENS,
    MAX_HESSIAN_BYTES,
    WINDOW,
    calibration_text,
    collect_hessians,
    hessian_bytes,
)
from engine.quant.recipes import (
    BASE,
    CALIBRATION_TEXT,
    Q46_OPTIONS,
    Q46_TARGET_BITS,
    RECIPES,
    Plan,
    calibrates,
    is_quantizable,
    mixed_plan,
)

Progress = Callable[[str, int, int], None]  # (phase, done, total)
METHODS = ("gptq", "rtn")


def _kind(name: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", name)


def calibration_llm(src: str | Path):
    """The source model, unquantized, for calibration runs of up to WINDOW tokens."""
    from engine.llm import LLM

    return LLM(src, weight_quant="none", enable_prefix_caching=False, max_concurrency=1, prefill_chunk=4096)


def calibration_tokens(llm, text: str, count: int) -> list[int]:
    """`text` tokenized (random ids for a model without a tokenizer), at most `count` tokens."""
    if llm.tokenizer is not None:
        tokens = llm.tokenizer.encode(text)
    else:
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, llm.model_config.vocab_size, (count,), generator=generator).tolist()
    return tokens[:count]


@torch.inference_mode()
def measure_sensitivity(
    llm, src: str | Path, progress: Progress | None = None
) -> tuple[dict[str, float], dict[str, int]]:
    """Per quantizable checkpoint tensor: KL(unquantized || that tensor alone at 4 bits) of the next-token
    distributions over the calibration text, and its number of weights."""
    model = llm.model
    tokens = calibration_tokens(llm, CALIBRATION_TEXT, 160)[: llm.max_context - 1]

    def logprobs() -> torch.Tensor:
        return sequence_logprobs(llm, tokens)

    base = logprobs()
    params = dict(model.named_parameters())
    source = open_source(src)
    names = [(name, t) for name, t in per_expert(source.weights()) if is_quantizable(name, t.shape)]
    sensitivity, numel, errors, costs = {}, {}, {}, {}
    for i, (name, tensor) in enumerate(names):
        mapped = model.param_for(name)
        param = params.get(mapped[0]) if mapped else None
        numel[name] = tensor.numel()
        norm = tensor.float().pow(2).sum().clamp_min(1e-30)
        quantized = {o: quantize(tensor, *o) for o in Q46_OPTIONS}
        dequantized = {o: dequantize(q) for o, q in quantized.items()}
        errors[name] = {o: ((d - tensor).pow(2).sum() / norm).item() for o, d in dequantized.items()}
        costs[name] = {o: q.bits_per_weight for o, q in quantized.items()}
        if param is None:
            sensitivity[name] = 0.0
            continue
        shard = mapped[1]

        def load(t, param=param, shard=shard):
            param.weight_loader(param, t, shard) if shard else param.weight_loader(param, t)

        load(dequantized[BASE])
        perturbed = logprobs()
        load(tensor)
        sensitivity[name] = torch.sum(base.exp() * (base - perturbed), dim=-1).mean().item()
        if progress:
            progress("measuring sensitivity", i + 1, len(names))
    return sensitivity, numel, errors, Q46_TARGET_BITS, costs


def convert(
    src: str | Path,
    out: str | Path,
    recipe: str,
    progress: Progress | None = None,
    method: str = "gptq",
    mmproj: str | Path | None = None,
) -> list[dict]:
    """Write `out` (.ninfer) from `src` under `recipe`; returns the per-kind summary rows.

    method: "gptq" quantizes each linear weight below 8 bits against its inputs on calibration text
    (engine/quant/gptq.py; an embedding tied to the head counts as the head), "rtn" rounds each weight to
    nearest (with the clipping search); untied embeddings and 8-bit weights are always rounded.
    mmproj: a GGUF source's vision tower (llama.cpp's mmproj file), written into the artifact as a
    multimodal checkpoint's tower is (16-bit)."""
    if recipe not in RECIPES:
        raise NinferError(f"unknown recipe '{recipe}'; use one of {', '.join(RECIPES)}")
    out = Path(out)
    if out.suffix != SUFFIX:
        raise NinferError(f"the output must end in {SUFFIX} (got {out.name})")
    if not out.parent.is_dir():
        raise NinferError(f"{out.parent} does not exist; create it or write elsewhere")
    if method not in METHODS:
        raise NinferError(f"unknown method '{method}'; use one of {', '.join(METHODS)}")
    source = open_source(src)
    if mmproj:
        source = with_mmproj(source, model_path(src), mmproj)
    llm = calibration_llm(src) if calibrates(recipe, method) else None
    if recipe == "q4.6":
        plan = mixed_plan(*measure_sensitivity(llm, src, progress))
    else:
        plan = Plan(recipe)  # uniform recipes: decided per tensor as it streams
    hessians: dict = {}  # hessians.Key -> H
    if llm is not None and method == "gptq":
        per_kv_head = hessian_bytes(llm.model, per_kv_head=True) <= MAX_HESSIAN_BYTES
        if per_kv_head or hessian_bytes(llm.model, per_kv_head=False) <= MAX_HESSIAN_BYTES:
            if progress:
                progress("collecting calibration activations", 0, 1)
            tokens = calibration_tokens(llm, calibration_text(), CALIBRATION_TOKENS)
            hessians = collect_hessians(llm, tokens, min(WINDOW, llm.max_context), per_kv_head)
            if progress:
                progress("collecting calibration activations", 1, 1)
        elif progress:
            progress("GPTQ skipped (activation statistics too large): round-to-nearest", 1, 1)
    model = llm.model if llm is not None else None
    del llm

    def hessian_for(name: str) -> torch.Tensor | None:
        mapped = model.param_for(name) if model is not None else None
        if not mapped:
            return None
        return hessians.get(mapped, hessians.get(mapped[0]))  # rows with their own statistics first

    summary: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "weights": 0, "bytes": 0, "bits": set()})
    state = {"done": 0}

    def stored():
        for name, tensor in per_expert(source.weights()):  # (stacked experts: each expert's matrices)
            kept = plan.quantize(name, tensor, hessian_for(name))
            row = summary[_kind(name)]
            row["tensors"] += 1
            row["weights"] += tensor.numel()
            if isinstance(kept, QuantizedTensor):
                row["bytes"] += kept.nbytes
                row["bits"].add(kept.bits)
            else:
                row["bytes"] += kept.numel() * kept.element_size()
                row["bits"].add(kept.element_size() * 8)
            state["done"] += 1
            if progress:
                progress("writing", state["done"], 0)
            yield name, kept

    src_desc = {"path": str(src), "description": source.description}
    write_container(out, source.config, source.tokenizer, stored(), recipe, src_desc)
    rows = []
    for kind, row in sorted(summary.items()):
        rows.append(
            {
                "kind": kind,
                "tensors": row["tensors"],
                "bits": "/".join(str(b) for b in sorted(row["bits"])),
                "bytes": row["bytes"],
                "bits_per_weight": 8 * row["bytes"] / max(row["weights"], 1),
            }
        )
    return rows
