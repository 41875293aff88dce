"""Quantization recipes for `ninfer convert`: which tensors get how many bits.

* bf16: every tensor in bf16.
* w4g128 / w6g128 / w8g128: every matrix (linear weights, embeddings) at 4 / 6 / 8 bits, group 128.
* q4.6: a mixed recipe reaching ~4.6 stored bits per matrix weight. Every matrix starts at 4 bits, group
  128; upgrades are bought where they lower the model's output error most per added bit, while the
  budget lasts. The options per matrix: 4 bits with group 32 (a 4-bit GGUF block: exact for such a
  source), 6 bits and 8 bits (group 128). The error is measured, not assumed: each matrix alone is
  replaced by its 4-bit g128 version and the KL divergence of the next-token distributions on a
  calibration text is taken against the unquantized model; an option's KL is estimated from it by the
  ratio of the option's squared reconstruction error to the 4-bit one.
Vectors (norms, biases, gates), small matrices and mixture-of-experts routers (`mlp.gate.weight`: which
experts a token takes turns on small differences of their scores, and the router is E x H, a sliver of
the model) stay in fp32 (bf16 in the bf16 recipe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.quant.gptq import gptq_quantize
from engine.quant.groupwise import fitting_group, quantize

RECIPES = ("q4.6", "w4g128", "w6g128", "w8g128", "bf16")
GROUP_SIZE = 128
MIN_DIM = 16  # matrices smaller than this in either dimension stay unquantized
Q46_TARGET_BITS = 4.6
# (bits, group size) options of q4.6 and their stored bits per weight (codes + fp16 scale, and an fp16
# minimum below 8 bits), K a multiple of the group
Option = tuple[int, int]
BASE: Option = (4, GROUP_SIZE)
Q46_OPTIONS: tuple[Option, ...] = (BASE, (4, 32), (6, GROUP_SIZE), (8, GROUP_SIZE))


def stored_bits(option: Option) -> float:
    bits, group = option
    return bits + (16 if bits == 8 else 32) / group


CALIBRATION_TEXT = (
    "The lighthouse keeper climbed the spiral stairs at dusk, as he had done every evening for thirty "
    "years. Below him the sea was restless, grey waves folding over the rocks, and the wind carried the "
    "smell of salt and rain. He trimmed the wick, polished the great lens, and watched the beam sweep out "
    "across the water. def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nPrint the first ten numbers, then explain why the loop runs in linear time. In 1850 the "
    "population of the town was 2,314; by 1900 it had doubled. Question: what is the capital of France? "
    "Answer: Paris, on the Seine, famous for its museums, bridges and cafes."
)


def uniform_bits(recipe: str) -> int | None:
    """The bits of a uniform recipe's matrices (w4g128 -> 4); None for bf16 and the mixed q4.6."""
    return int(recipe[1]) if recipe.startswith("w") else None


def calibrates(recipe: str, method: str) -> bool:
    """Whether converting under `recipe` runs the model on calibration text: q4.6 measures each matrix's
    sensitivity, GPTQ compensates the weights below 8 bits (8-bit ones are rounded: Plan.quantize)."""
    bits = uniform_bits(recipe)
    return recipe == "q4.6" or (method == "gptq" and bits is not None and bits < 8)


def is_quantizable(name: str, shape: tuple[int, ...] | torch.Size) -> bool:
    """Whether a checkpoint tensor of this name and shape is a matrix the recipes quantize. Routers and the
    vision tower stay 16-bit: a wrong expert choice costs more than a router's bytes save, and the tower
    runs once an image (its error would compound through every block into each image token)."""
    router = name.endswith(".mlp.gate.weight")
    return (
        len(shape) == 2
        and min(shape) >= MIN_DIM
        and name.endswith("weight")
        and not router
        and not is_tower(name)
    )


def is_tower(name: str) -> bool:
    """A vision-tower tensor, as a checkpoint (model.visual.*) or the planner (visual.*) names it."""
    return name.startswith(("model.visual.", "visual."))


@dataclass(frozen=True)
class Plan:
    """How a recipe stores each checkpoint tensor. q4.6 carries its (bits, group size) per tensor name
    (absent: unquantized); the uniform recipes decide from the tensor itself."""

    recipe: str
    options: dict[str, Option] = field(default_factory=dict)

    def quantize(self, name: str, tensor: torch.Tensor, hessian: torch.Tensor | None = None):
        """The stored form of one checkpoint tensor under this plan; with `hessian` (the layer's input
        statistics) quantized by GPTQ below 8 bits where its shape allows, else rounded to nearest."""
        if self.recipe == "bf16":
            return tensor.to(torch.bfloat16)
        if self.recipe == "q4.6":
            option = self.options.get(name)
        else:
            option = (uniform_bits(self.recipe), GROUP_SIZE) if is_quantizable(name, tensor.shape) else None
        if option is None:  # kept unquantized: fp32, the tower in the 16 bits it ships in
            return tensor.to(torch.bfloat16) if is_tower(name) else tensor.float()
        bits, group = option
        # NOTE: 8-bit weights are rounded to nearest: their error is already small, and compensating it
        # against the calibration text's statistics measured worse on other text (perplexity +0.32% vs
        # -0.14% on the default model; 6 bits: +1.85% vs +3.14%, 4 bits: +57% vs +90%)
        if hessian is not None and bits < 8 and tensor.shape[1] % fitting_group(tensor.shape[1], group) == 0:
            return gptq_quantize(tensor, hessian, bits, group)
        return quantize(tensor, *option)


def mixed_plan(
    sensitivity: dict[str, float],
    numel: dict[str, int],
    errors: dict[str, dict[Option, float]],
    target_bits: float = Q46_TARGET_BITS,
    costs: dict[str, dict[Option, float]] | None = None,
) -> Plan:
    """Greedy: repeatedly buy the upgrade with the largest estimated KL drop per added bit that fits.

    sensitivity: name -> KL with only that tensor at BASE; errors: name -> option -> squared relative
    reconstruction error; costs: name -> option -> stored bits per weight as actually written (padding of
    K to the group included); default: stored_bits(option).
    """
    options = dict.fromkeys(sensitivity, BASE)

    def bits(name: str, option: Option) -> float:
        return costs[name][option] if costs else stored_bits(option)

    budget = sum((target_bits - bits(n, BASE)) * numel[n] for n in options)

    def kl(name: str, option: Option) -> float:
        base_err = errors[name][BASE]
        return sensitivity[name] * (errors[name][option] / base_err if base_err > 0 else 0.0)

    while True:
        best, best_gain = None, 0.0
        for name, current in options.items():
            for option in Q46_OPTIONS:
                cost = (bits(name, option) - bits(name, current)) * numel[name]
                gain = kl(name, current) - kl(name, option)
                if cost > 0 and cost <= budget and gain > 0 and gain / cost > best_gain:
                    best, best_gain = (name, option, cost), gain / cost
        if best is None:
            return Plan("q4.6", options)
        name, option, cost = best
        options[name] = option
        budget -= cost
