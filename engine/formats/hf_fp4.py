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
16-bit). Where the fused kernels run (a GPU), `--weight-quant auto` holds the matrices as stored
(`native_weights`: Fp4Tensors, multiplied by kernels/fp4_matmul, engine/quant/fp4_layer.py; a mixture of
experts' stacked by engine/layers/moe.pack_fp4_experts for kernels/fused_moe); `int8` / `int4` quantize
them again as they load (engine/quant/on_load.py), `none` and the CPU read them dequantized
(`dequantized`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats import qwen3_next

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
            scale, global_scale = _scales(layer, read, scheme)
            if scheme.label == "MXFP4":
                scale = _e8m0(scale, layer)
            g = global_scale.float().reshape(())
            multiplier = 1 / g if scheme.tool == CT else g
            yield f"{layer}.weight", dequantize_fp4(tensor, scale, multiplier, layer, scheme.group)
            continue
        yield name, tensor


@dataclass(frozen=True)
class Fp4Tensor:
    """An NVFP4 / MXFP4 matrix as its checkpoint stores it (kernels/fp4_matmul's layout)."""

    packed: torch.Tensor  # uint8 [N, K / 2]: e2m1 codes, column 2j in byte j's low nibble
    scale_codes: torch.Tensor  # uint8 [N, ceil(K / group_size)]: e4m3 bits (NVFP4) or e8m0 exponents (MXFP4)
    multiplier: torch.Tensor  # fp32 [N]: the tensor's scale, each row's
    group_size: int
    e8m0: bool
    shape: tuple[int, int]  # [N, K]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale_codes, self.multiplier))

    def to(self, device: torch.device | str) -> Fp4Tensor:
        """The matrix on `device`."""
        moved = [t.to(device) for t in (self.packed, self.scale_codes, self.multiplier)]
        return replace(self, packed=moved[0], scale_codes=moved[1], multiplier=moved[2])

    def rows(self, index: torch.Tensor) -> Fp4Tensor:
        """The matrix's rows `index` (int64), in that order."""
        pick = [t.index_select(0, index) for t in (self.packed, self.scale_codes, self.multiplier)]
        return replace(
            self, packed=pick[0], scale_codes=pick[1], multiplier=pick[2], shape=(len(index), self.shape[1])
        )

    def dequantized(self) -> torch.Tensor:
        """bf16 [N, K], as `dequantized` reads the checkpoint."""
        scale = (
            _e8m0(self.scale_codes, "the matrix") if self.e8m0 else self.scale_codes.view(torch.float8_e4m3fn)
        )
        return dequantize_fp4(self.packed, scale, self.multiplier[:, None], group=self.group_size)


def native_weights(
    names: list[str],
    read: Callable[[str], torch.Tensor | None],
    scheme: Fp4Scheme,
    config: ModelConfig,
    arranged: Callable[[Iterator[tuple[str, torch.Tensor]]], Iterator[tuple[str, torch.Tensor]]],
) -> tuple[Callable[[], Iterator[tuple[str, Fp4Tensor]]], Callable[[], Iterator[tuple[str, torch.Tensor]]]]:
    """(quantized, unquantized) over a checkpoint's tensors (`names`; `read(name)` one): each FP4 layer as an
    Fp4Tensor named `<layer>.weight` (a Qwen3-Next fused projection's two parts apart, as Qwen3.5's layout
    names them), and the other tensors as stored, `arranged` (the activations' scales left out)."""
    layers, rest = fp4_layers(names, scheme)

    def quantized() -> Iterator[tuple[str, Fp4Tensor]]:
        for layer in layers:
            tensor, name = fp4_tensor(layer, read, scheme), f"{layer}.weight"
            parts = qwen3_next.fused_parts(name, config)
            if parts is None:
                yield name, tensor
                continue
            for part, rows in parts:  # (Qwen3-Next's fused input projections, as Qwen3.5's layout)
                yield part, tensor.rows(rows)

    def unquantized() -> Iterator[tuple[str, torch.Tensor]]:
        return arranged((name, read(name)) for name in rest)

    return quantized, unquantized


def fp4_layers(names, scheme: Fp4Scheme) -> tuple[list[str], list[str]]:
    """(the FP4 layers' prefixes, the other tensors' names but the activations' scales) of a checkpoint's
    tensor `names`. A layer is FP4 by its codes' name, or for Model Optimizer (whose codes are named
    `weight`, as a 16-bit layer's matrix is) by its second scale."""
    present = set(names)
    codes = f".{scheme.codes_name}"
    layers = [
        n[: -len(codes)]
        for n in names
        if n.endswith(codes) and (n.endswith(".weight_packed") or f"{n}_scale_2" in present)
    ]
    parts = {
        f"{layer}.{p}" for layer in layers for p in (scheme.codes_name, "weight_scale", scheme.global_name)
    }
    return layers, [n for n in names if n not in parts and not n.endswith(_UNUSED)]


def fp4_tensor(layer: str, read: Callable[[str], torch.Tensor | None], scheme: Fp4Scheme) -> Fp4Tensor:
    """One FP4 layer of the checkpoint as stored; what is missing or cannot be held so, in a sentence."""
    name = f"{layer}.{scheme.codes_name}"
    packed, (scale, global_scale) = read(name), _scales(layer, read, scheme)
    n, half = packed.shape
    if packed.dtype != torch.uint8 or tuple(scale.shape) != (n, -(-2 * half // scheme.group)):
        raise NinferError(
            f"{name}: {scheme.label} codes are uint8 [N, K / 2] with a scale [N, K / {scheme.group}], not "
            f"{packed.dtype} {tuple(packed.shape)} with {tuple(scale.shape)}; the checkpoint is damaged"
        )
    if scheme.label == "MXFP4":
        _e8m0(scale, layer)  # (its checks)
        codes = scale
    elif scale.dtype != torch.float8_e4m3fn:
        raise NinferError(
            f"{layer}: its NVFP4 scale is {scale.dtype}, not e4m3; load it with --weight-quant int8 (held as "
            "8-bit groups) or none (16-bit)"
        )
    else:
        codes = scale.view(torch.uint8)
        if bool(((codes & 0x7F) == 0x7F).any()):
            raise NinferError(f"{layer}: its NVFP4 scales hold NaN; the checkpoint is damaged")
    g = global_scale.float().reshape(())
    multiplier = (1 / g if scheme.tool == CT else g).expand(n).contiguous()
    return Fp4Tensor(packed, codes, multiplier, scheme.group, scheme.label == "MXFP4", (n, 2 * half))


def _scales(
    layer: str, read: Callable[[str], torch.Tensor | None], scheme: Fp4Scheme
) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP4 layer's group scales and tensor scale (MXFP4: 1) as stored; a missing one named."""
    scale = read(f"{layer}.weight_scale")
    global_scale = read(f"{layer}.{scheme.global_name}") if scheme.global_name else torch.ones(())
    if scale is None or global_scale is None:
        missing = f"{layer}.weight_scale" if scale is None else f"{layer}.{scheme.global_name}"
        raise NinferError(
            f"{layer}.{scheme.codes_name} is {scheme.label} but the checkpoint has no {missing}; download it again"
        )
    return scale, global_scale


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
