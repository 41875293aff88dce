"""Quantization recipes for `ninfer convert`: which tensors get how many bits.

* bf16: every tensor in bf16.
* w4g128 / w6g128 / w8g128: every matrix (linear weights, embeddings) at 4 / 6 / 8 bits, group 128.
* q4.6: a mixed recipe reaching ~4.6 bits per weight. Every matrix starts at 4 bits; the matrices whose
  4-bit error moves the model's output most per byte are raised to 6 and then 8 bits while the budget
  lasts. The error is measured, not assumed: each matrix alone is replaced by its 4-bit version and the
  KL divergence of the next-token distributions on a calibration text is taken against the unquantized
  model.
Vectors (norms, biases, gates) and small matrices stay in fp32 (bf16 in the bf16 recipe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.quant.groupwise import quantize

RECIPES = ("q4.6", "w4g128", "w6g128", "w8g128", "bf16")
GROUP_SIZE = 128
MIN_DIM = 16  # matrices smaller than this in either dimension stay unquantized
Q46_TARGET_BITS = 4.6
# bits per weight of each width at group 128 (codes + fp16 scale, and fp16 minimum below 8 bits)
STORED_BITS = {4: 4 + 32 / GROUP_SIZE, 6: 6 + 32 / GROUP_SIZE, 8: 8 + 16 / GROUP_SIZE}

CALIBRATION_TEXT = (
    "The lighthouse keeper climbed the spiral stairs at dusk, as he had done every evening for thirty "
    "years. Below him the sea was restless, grey waves folding over the rocks, and the wind carried the "
    "smell of salt and rain. He trimmed the wick, polished the great lens, and watched the beam sweep out "
    "across the water. def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nPrint the first ten numbers, then explain why the loop runs in linear time. In 1850 the "
    "population of the town was 2,314; by 1900 it had doubled. Question: what is the capital of France? "
    "Answer: Paris, on the Seine, famous for its museums, bridges and cafes."
)


def is_quantizable(name: str, tensor: torch.Tensor) -> bool:
    return tensor.dim() == 2 and min(tensor.shape) >= MIN_DIM and name.endswith("weight")


@dataclass(frozen=True)
class Plan:
    """Bits per checkpoint tensor name (absent: unquantized)."""

    recipe: str
    bits: dict[str, int]

    def quantize(self, name: str, tensor: torch.Tensor):
        """The stored form of one checkpoint tensor under this plan."""
        if self.recipe == "bf16":
            return tensor.to(torch.bfloat16)
        bits = self.bits.get(name)
        if bits is None:
            return tensor.float()
        return quantize(tensor, bits, GROUP_SIZE)


def uniform_plan(recipe: str, shapes: dict[str, torch.Size]) -> Plan:
    if recipe == "bf16":
        return Plan(recipe, {})
    bits = int(recipe[1])
    return Plan(
        recipe,
        {n: bits for n, s in shapes.items() if len(s) == 2 and min(s) >= MIN_DIM and n.endswith("weight")},
    )


def mixed_plan(
    sensitivity: dict[str, float], numel: dict[str, int], target_bits: float = Q46_TARGET_BITS
) -> Plan:
    """Raise the most output-sensitive matrices per weight to 6, then 8 bits while the average stays <= target.

    sensitivity: checkpoint tensor name -> output error (KL) with only that tensor at 4 bits.
    """
    bits = dict.fromkeys(sensitivity, 4)
    total = sum(numel[n] for n in bits)
    budget = target_bits * total - sum(STORED_BITS[4] * numel[n] for n in bits)
    order = sorted(bits, key=lambda n: sensitivity[n] / numel[n], reverse=True)
    for step_to in (6, 8):
        for name in order:
            cost = (STORED_BITS[step_to] - STORED_BITS[bits[name]]) * numel[name]
            if bits[name] < step_to and cost <= budget and sensitivity[name] > 0:
                bits[name] = step_to
                budget -= cost
    return Plan("q4.6", bits)


def average_bits(plan: Plan, numel: dict[str, int]) -> float:
    quantized = [n for n in plan.bits]
    total = sum(numel[n] for n in quantized)
    return sum(STORED_BITS[plan.bits[n]] * numel[n] for n in quantized) / max(total, 1)
