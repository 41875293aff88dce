"""NVFP4 HF checkpoints, dequantized as the tensors stream: 4-bit floats (e2m1) in groups of 16 input
columns, each group's e4m3 scale, and one fp32 scale a tensor.

* llm-compressor (`quant_method: compressed-tensors`, format `nvfp4-pack-quantized`): `weight_packed` uint8
  [N, K / 2], `weight_scale` e4m3 [N, K / 16], `weight_global_scale` fp32 [1], which divides:
  w = e2m1 x weight_scale / weight_global_scale.
* NVIDIA's Model Optimizer (`quant_method: modelopt`, `quant_algo: NVFP4`): `weight` uint8 [N, K / 2],
  `weight_scale` e4m3 [N, K / 16], `weight_scale_2` fp32, which multiplies: w = e2m1 x weight_scale x
  weight_scale_2.
Byte j of a row holds columns 2 j (low nibble) and 2 j + 1 (high); a nibble's bit 3 is the sign, bits 0-2
index the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6. The activations' scales are not needed (activations stay
16-bit). There is no FP4 weight kernel: where the fused kernels run, `--weight-quant auto` holds the
matrices as 8-bit groups (engine/quant/on_load.py; `int4` at 4 bits, rounded again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from engine.errors import NinferError

GROUP = 16
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
CT = "compressed-tensors"
MODELOPT = "modelopt"
# the activations' scales and a KV cache's: not loaded
_UNUSED = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale", ".kv_scale")


@dataclass(frozen=True)
class Fp4Scheme:
    tool: str  # CT or MODELOPT
    label: str = "NVFP4"

    @property
    def codes_name(self) -> str:
        return "weight_packed" if self.tool == CT else "weight"

    @property
    def global_name(self) -> str:
        return "weight_global_scale" if self.tool == CT else "weight_scale_2"


def fp4_scheme(quant: dict[str, Any], where: str) -> Fp4Scheme | None:
    """The NVFP4 scheme of a quantization_config, None where it is not NVFP4."""
    method = str(quant.get("quant_method", "")).lower()
    if method == MODELOPT:
        algo = str(quant.get("quant_algo") or (quant.get("quantization") or {}).get("quant_algo") or "")
        if algo.upper() != "NVFP4":
            raise NinferError(
                f"{where} was quantized by NVIDIA's Model Optimizer as {algo or '?'}; ninfer reads its NVFP4 "
                "checkpoints (or give the bf16 or FP8 checkpoint)"
            )
        return Fp4Scheme(MODELOPT)
    if method == CT and quant.get("format") == "nvfp4-pack-quantized":
        weights = [g.get("weights") or {} for g in (quant.get("config_groups") or {}).values()]
        if weights and all(
            w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size", GROUP) == GROUP
            for w in weights
        ):
            return Fp4Scheme(CT)
    return None


def dequantized(
    tensors: Iterator[tuple[str, torch.Tensor]],
    read: Callable[[str], torch.Tensor | None],
    scheme: Fp4Scheme,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with every NVFP4 matrix dequantized to bf16 as `<layer>.weight` (`read(name)`:
    any tensor of the checkpoint by name, None where it has none); the scales are not passed on."""
    codes_suffix, global_suffix = f".{scheme.codes_name}", f".{scheme.global_name}"
    for name, tensor in tensors:
        if name.endswith((".weight_scale", global_suffix, *_UNUSED)):
            continue
        if name.endswith(codes_suffix) and tensor.dtype == torch.uint8:
            layer = name[: -len(codes_suffix)]
            scale, global_scale = read(f"{layer}.weight_scale"), read(f"{layer}{global_suffix}")
            if scale is None or global_scale is None:
                missing = f"{layer}.weight_scale" if scale is None else f"{layer}{global_suffix}"
                raise NinferError(f"{name} is NVFP4 but the checkpoint has no {missing}; download it again")
            g = global_scale.float().reshape(())
            yield f"{layer}.weight", dequantize_fp4(tensor, scale, 1 / g if scheme.tool == CT else g, layer)
            continue
        yield name, tensor


def dequantize_fp4(
    packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | float, name: str = "the matrix"
) -> torch.Tensor:
    """packed [..., N, K / 2] uint8, scale [..., N, K / 16] (e4m3) -> bf16 [..., N, K]: e2m1 x scale x
    global_scale (the multiplier)."""
    *lead, n, half = packed.shape
    k = 2 * half
    if tuple(scale.shape) != (*lead, n, -(-k // GROUP)):
        raise NinferError(
            f"{name}: its scale is {tuple(scale.shape)}, but a {n} x {k} NVFP4 matrix has {(*lead, n, -(-k // GROUP))}"
        )
    nibbles = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()  # [..., N, K]
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1))  # (bit 3: the sign)
    values = table[nibbles]
    s = scale.float().repeat_interleave(GROUP, dim=-1)[..., :k] * global_scale
    return (values * s).to(torch.bfloat16)
