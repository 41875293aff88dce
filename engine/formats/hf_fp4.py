"""NVFP4 and MXFP4 HF checkpoints, dequantized as the tensors stream: 4-bit floats (e2m1) in groups of input
columns, each group's scale (NVFP4: groups of 16, an e4m3 scale, and one fp32 scale a tensor; MXFP4: groups
of 32, a power of two).

* llm-compressor (`quant_method: compressed-tensors`, format `nvfp4-pack-quantized`): `weight_packed` uint8
  [N, K / 2], `weight_scale` e4m3 [N, K / 16], `weight_global_scale` fp32 [1], which divides:
  w = e2m1 x weight_scale / weight_global_scale.
* NVIDIA's Model Optimizer (`quant_method: modelopt`, `quant_algo: NVFP4`): `weight` uint8 [N, K / 2],
  `weight_scale` e4m3 [N, K / 16], `weight_scale_2` fp32, which multiplies: w = e2m1 x weight_scale x
  weight_scale_2.
* llm-compressor's MXFP4 (format `mxfp4-pack-quantized`, weights float, 4 bits, groups of 32):
  `weight_packed` uint8 [N, K / 2], `weight_scale` uint8 [N, K / 32], an e8m0 exponent (2^(s - 127); 255
  is NaN, refused): w = e2m1 x 2^(s - 127); no tensor scale.
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

GROUP = 16  # NVFP4's
MX_GROUP = 32  # MXFP4's
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
CT = "compressed-tensors"
MODELOPT = "modelopt"
# the activations' scales and a KV cache's: not loaded
_UNUSED = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale", ".kv_scale")


@dataclass(frozen=True)
class Fp4Scheme:
    tool: str  # CT or MODELOPT
    label: str = "NVFP4"  # or "MXFP4" (compressed-tensors)

    @property
    def group(self) -> int:
        return MX_GROUP if self.label == "MXFP4" else GROUP

    @property
    def codes_name(self) -> str:
        return "weight_packed" if self.tool == CT else "weight"

    @property
    def global_name(self) -> str | None:
        """The tensor scale's name (None: MXFP4 has none)."""
        if self.label == "MXFP4":
            return None
        return "weight_global_scale" if self.tool == CT else "weight_scale_2"


def fp4_scheme(quant: dict[str, Any], where: str) -> Fp4Scheme | None:
    """The NVFP4 / MXFP4 scheme of a quantization_config, None where it is neither."""
    method = str(quant.get("quant_method", "")).lower()
    if method == MODELOPT:
        algo = str(quant.get("quant_algo") or (quant.get("quantization") or {}).get("quant_algo") or "")
        if algo.upper() != "NVFP4":
            raise NinferError(
                f"{where} was quantized by NVIDIA's Model Optimizer as {algo or '?'}; ninfer reads its NVFP4 "
                "checkpoints (or give the bf16 or FP8 checkpoint)"
            )
        return Fp4Scheme(MODELOPT)
    if method != CT:
        return None
    groups = list((quant.get("config_groups") or {}).values())
    formats = {g.get("format") or quant.get("format") for g in groups} or {quant.get("format")}
    weights = [g.get("weights") or {} for g in groups]
    for label, fmt, size in (
        ("NVFP4", "nvfp4-pack-quantized", GROUP),
        ("MXFP4", "mxfp4-pack-quantized", MX_GROUP),
    ):
        if formats != {fmt}:
            continue
        if weights and all(
            w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size", size) == size
            for w in weights
        ):
            return Fp4Scheme(CT, label)
        raise NinferError(
            f"{where} is {fmt} but its weights are not 4-bit floats in groups of {size} "
            f"({weights}); ninfer reads {label} as llm-compressor writes it (or give the bf16 checkpoint)"
        )
    return None


def dequantized(
    tensors: Iterator[tuple[str, torch.Tensor]],
    read: Callable[[str], torch.Tensor | None],
    scheme: Fp4Scheme,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with every NVFP4 / MXFP4 matrix dequantized to bf16 as `<layer>.weight`
    (`read(name)`: any tensor of the checkpoint by name, None where it has none); the scales are not passed
    on."""
    codes_suffix = f".{scheme.codes_name}"
    global_suffix = f".{scheme.global_name}" if scheme.global_name else None
    skipped = (".weight_scale", *_UNUSED) + ((global_suffix,) if global_suffix else ())
    for name, tensor in tensors:
        if name.endswith(skipped):
            continue
        if name.endswith(codes_suffix) and tensor.dtype == torch.uint8:
            layer = name[: -len(codes_suffix)]
            scale = read(f"{layer}.weight_scale")
            global_scale = read(f"{layer}{global_suffix}") if global_suffix else torch.ones(())
            if scale is None or global_scale is None:
                missing = f"{layer}.weight_scale" if scale is None else f"{layer}{global_suffix}"
                raise NinferError(
                    f"{name} is {scheme.label} but the checkpoint has no {missing}; download it again"
                )
            if scheme.label == "MXFP4":
                scale = _e8m0(scale, layer)
            g = global_scale.float().reshape(())
            multiplier = 1 / g if scheme.tool == CT else g
            yield f"{layer}.weight", dequantize_fp4(tensor, scale, multiplier, layer, scheme.group)
            continue
        yield name, tensor


def _e8m0(scale: torch.Tensor, name: str) -> torch.Tensor:
    """MXFP4's uint8 exponents as their powers of two (fp32): 2^(s - 127); 255 (NaN) refused."""
    if scale.dtype != torch.uint8:
        raise NinferError(f"{name}: its MXFP4 scale is {scale.dtype}, not e8m0 exponents (uint8)")
    if bool((scale == 255).any()):
        raise NinferError(f"{name}: its MXFP4 scales hold NaN (exponent 255); the checkpoint is damaged")
    return torch.exp2(scale.float() - 127)


def dequantize_fp4(
    packed: torch.Tensor,
    scale: torch.Tensor,
    global_scale: torch.Tensor | float,
    name: str = "the matrix",
    group: int = GROUP,
) -> torch.Tensor:
    """packed [..., N, K / 2] uint8, scale [..., N, K / group] (e4m3, or fp32) -> bf16 [..., N, K]: e2m1 x
    scale x global_scale (the multiplier)."""
    *lead, n, half = packed.shape
    k = 2 * half
    if tuple(scale.shape) != (*lead, n, -(-k // group)):
        raise NinferError(
            f"{name}: its scale is {tuple(scale.shape)}, but a {n} x {k} FP4 matrix in groups of {group} has "
            f"{(*lead, n, -(-k // group))}"
        )
    nibbles = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).long()  # [..., N, K]
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1))  # (bit 3: the sign)
    values = table[nibbles]
    s = scale.float().repeat_interleave(group, dim=-1)[..., :k] * global_scale
    return (values * s).to(torch.bfloat16)
