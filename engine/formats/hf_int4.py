"""AWQ, GPTQ and compressed-tensors 4-bit HF checkpoints (Qwen's `-AWQ` and `-GPTQ-Int4` releases,
AutoAWQ's, GPTQModel's and llm-compressor's W4A16 output) read as ninfer's own 4-bit groups, so the fused
W4A16 kernels multiply them as they are.

AWQ and GPTQ store a linear layer's W [N, K] as `qweight` (int32 words of eight 4-bit codes), `qzeros`
(the groups' zero points, packed the same way) and fp16 `scales` [K / G, N], groups of G input columns:
w[n, k] = (q[k, n] - z[k / G, n]) * s[k / G, n].
* AWQ (`version: gemm`): qweight [K, N / 8] packed along the output dimension in AutoAWQ's order (the
  word's nibble i holds column 8 c + (0, 2, 4, 6, 1, 3, 5, 7)[i]), qzeros [K / G, N / 8] alike.
* GPTQ: qweight [K / 8, N] packed along the input dimension (nibble i of word r holds row 8 r + i), qzeros
  [K / G, N / 8] along the output one; the original format (`checkpoint_format: gptq`) stores each zero
  point minus one, `gptq_v2` as it is. `g_idx` must give contiguous groups: act-order checkpoints
  (desc_act, where rows of a group are scattered) are refused.
* compressed-tensors (`format: pack-quantized`, 4-bit int weights, group or channel strategy):
  `weight_packed` [N, K / 8] packed along the input dimension (nibble i of word c holds column 8 c + i),
  each code stored plus 8; `weight_scale` [N, K / G]; `weight_zero_point` [N / 8, K / G] packed along
  the output dimension, plus 8 too (asymmetric schemes; a symmetric one has none: 8); `weight_shape` (N, K).
ninfer's groups (engine/quant/groupwise.py) hold w = q * scale + minimum: the codes and scales are the
checkpoint's, the minimum -z * s (rounded once to fp16: within 1% of a code step). Matrices the tool left in
16 bits (lm_head, embeddings, a router) stream as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.source import ModelSource, WeightIterator
from engine.quant.groupwise import QuantizedTensor, dequantize, pack
from engine.tokenizer import Tokenizer

# a layer's tensors, by method: (codes, zero points, scales, group index, shape)
PARTS = {
    "awq": ("qweight", "qzeros", "scales", "g_idx"),
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
    "compressed-tensors": (
        "weight_packed",
        "weight_zero_point",
        "weight_scale",
        "weight_g_idx",
        "weight_shape",
    ),
}
CT = "compressed-tensors"
AWQ_COLUMNS = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a word's eight is its nibble AWQ_COLUMNS[j]


@dataclass(frozen=True)
class Int4Scheme:
    method: str  # "awq", "gptq" or "compressed-tensors"
    group_size: int  # input columns a group (-1: the whole row)
    zero_offset: int  # added to a stored zero point (GPTQ's original format stores it minus one)

    @property
    def label(self) -> str:
        return {"awq": "AWQ", "gptq": "GPTQ"}.get(self.method, self.method) + " 4-bit"


def int4_scheme(quant: dict[str, Any], method: str, architecture: str, where: str) -> Int4Scheme:
    """The scheme of an AWQ / GPTQ quantization_config, or a one-line refusal of what ninfer cannot read."""
    bits, group = quant.get("bits", quant.get("w_bit")), quant.get("group_size", quant.get("q_group_size"))
    if bits != 4:
        raise NinferError(
            f"{where} is {method} at {bits} bits; ninfer reads 4-bit {method.upper()} checkpoints"
        )
    if not isinstance(group, int) or not (group == -1 or group > 0):
        raise NinferError(f"{where}: its {method} group_size {group!r} is not a positive whole number or -1")
    if architecture == "Qwen3NextForCausalLM":
        raise NinferError(
            f"{where}: a Qwen3-Next checkpoint quantized by {method} is not read (its fused projections would "
            "need splitting in their packed form); give the bf16 checkpoint or a GGUF file"
        )
    if method == CT:
        return Int4Scheme(CT, group, 0)
    if method == "awq":
        version = str(quant.get("version", "gemm")).lower()
        if version != "gemm" or quant.get("zero_point", True) is not True:
            raise NinferError(
                f"{where} is AWQ {version}{'' if quant.get('zero_point', True) else ' without zero points'}; "
                "ninfer reads AWQ's gemm layout with zero points (AutoAWQ's default)"
            )
        return Int4Scheme("awq", group, 0)
    if quant.get("desc_act"):
        raise NinferError(
            f"{where} is GPTQ with act-order (desc_act), whose groups are not contiguous rows; use a GPTQ "
            "checkpoint made without desc_act, an AWQ one, or the bf16 checkpoint with `ninfer convert`"
        )
    fmt = str(quant.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise NinferError(f"{where} is GPTQ in the {fmt} format; ninfer reads the gptq and gptq_v2 formats")
    return Int4Scheme("gptq", group, 1 if fmt == "gptq" else 0)


def compressed_tensors_scheme(quant: dict[str, Any], architecture: str, where: str) -> Int4Scheme | None:
    """The scheme of a compressed-tensors `pack-quantized` config whose weights are all 4-bit integers in
    one group size (None where they are not: refused by the caller)."""
    weights = [g.get("weights") or {} for g in (quant.get("config_groups") or {}).values()]
    if not weights or any(w.get("type") != "int" or w.get("num_bits") != 4 for w in weights):
        return None
    if any(w.get("actorder") not in (None, False) for w in weights):
        raise NinferError(
            f"{where} is compressed-tensors W4A16 with act-order, whose groups are not contiguous columns; "
            "ninfer does not read it (use one made without actorder, or the bf16 checkpoint)"
        )
    groups = {w.get("group_size") if w.get("strategy") == "group" else -1 for w in weights}
    if len(groups) != 1 or any(w.get("strategy") not in ("group", "channel") for w in weights):
        raise NinferError(f"{where}: its 4-bit groups mix strategies or sizes ({sorted(map(str, groups))})")
    return int4_scheme({"bits": 4, "group_size": groups.pop()}, CT, architecture, where)


def _bytes(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., 4 W]: byte j of word w (bits 8 j .. 8 j + 7, little-endian) at 4 w + j.
    Its two nibbles are codes 2 j and 2 j + 1 of the word: ninfer's packing of an (even, odd) pair."""
    assert sys.byteorder == "little"
    return words.to(torch.int32).contiguous().view(torch.uint8)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> codes [..., 8 W] (uint8): nibble i of word w at 8 w + i."""
    b = _bytes(words)
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def _awq_columns(words: torch.Tensor) -> torch.Tensor:
    """AWQ's words [R, N / 8] -> codes [R, N], columns in order."""
    codes = _nibbles(words)
    return codes.view(*codes.shape[:-1], -1, 8)[..., list(AWQ_COLUMNS)].flatten(-2)


def to_groupwise(parts: dict[str, torch.Tensor], scheme: Int4Scheme, name: str) -> QuantizedTensor:
    """One linear layer's tensors (PARTS, by their last names) as a 4-bit QuantizedTensor of W [N, K]."""
    needed = ("weight_packed", "weight_scale") if scheme.method == CT else PARTS[scheme.method][:3]
    missing = [p for p in needed if p not in parts]
    if missing:
        raise NinferError(f"{name}: the checkpoint lacks its {', '.join(missing)}; download it again")
    if scheme.method == CT:
        return _compressed_tensors(parts, scheme, name)
    scales = parts["scales"]  # [K / G, N]
    groups, n = scales.shape
    qweight = parts["qweight"]
    if scheme.method == "awq":  # [K, N / 8]
        k, columns = qweight.shape[0], 8 * qweight.shape[1]
        zeros = _awq_columns(parts["qzeros"])  # [K / G, N]
    else:  # [K / 8, N]: each word's bytes are ninfer's packed pairs of its eight rows already
        k, columns = 8 * qweight.shape[0], qweight.shape[1]
        zeros = _nibbles(parts["qzeros"])  # [K / G, N]
    group = k if scheme.group_size == -1 else scheme.group_size
    if columns != n or zeros.shape != (groups, n) or groups * group != k:
        raise NinferError(
            f"{name}: qweight {tuple(parts['qweight'].shape)}, qzeros {tuple(parts['qzeros'].shape)} and "
            f"scales {tuple(scales.shape)} do not make one matrix in groups of {group}; download it again"
        )
    _check_groups(parts.get("g_idx"), k, group, f"{name}.g_idx")
    if scheme.method == "awq":
        packed = pack(_awq_columns(qweight).t(), 4)
    else:
        packed = _bytes(qweight).view(k // 8, n, 4).permute(1, 0, 2).reshape(n, k // 2)
    zeros = zeros.to(torch.int32) + scheme.zero_offset
    return _groupwise(packed, scales.t(), zeros.t(), group, (n, k))


def _compressed_tensors(parts: dict[str, torch.Tensor], scheme: Int4Scheme, name: str) -> QuantizedTensor:
    scales = parts["weight_scale"].float()  # [N, K / G]
    words = parts["weight_packed"]  # [N, ceil(K / 8)]
    n, groups = scales.shape
    width = 8 * words.shape[1]
    shape = parts.get("weight_shape")
    k = int(shape[1]) if shape is not None else width
    group = k if scheme.group_size == -1 else scheme.group_size
    zero_point = parts.get("weight_zero_point")  # [N / 8, K / G]
    zeros = torch.full((n, groups), 8) if zero_point is None else _nibbles(zero_point.t()).t()[:n]
    if words.shape[0] != n or width < k or zeros.shape != (n, groups) or -(-k // group) != groups:
        raise NinferError(
            f"{name}: weight_packed {tuple(parts['weight_packed'].shape)}, weight_scale {tuple(scales.shape)} "
            f"and its zero points do not make one {n} x {k} matrix in groups of {group}; download it again"
        )
    _check_groups(parts.get("weight_g_idx"), k, group, f"{name}.weight_g_idx")
    kp = groups * group
    if width == k == kp:  # each word's bytes are ninfer's packed pairs of its eight columns already
        packed = _bytes(words)
    else:  # codes past K (a padded last word, a last group cut short) are zero
        packed = pack(torch.nn.functional.pad(_nibbles(words)[:, :k], (0, kp - k)), 4)
    return _groupwise(packed, scales, zeros, group, (n, k))


def _check_groups(g_idx: torch.Tensor | None, k: int, group: int, name: str) -> None:
    """A group index must put the input columns in their groups in order (act-order scatters them)."""
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // group):
        raise NinferError(
            f"{name} orders input columns out of their groups (act-order), which ninfer does not read"
        )


def _groupwise(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int, shape: tuple[int, int]
) -> QuantizedTensor:
    """packed codes [N, Kp / 2] (ninfer's layout), scales and zero points [N, Kp / group] -> ninfer's 4-bit
    groups (minimum -z s)."""
    scales = scales.float()
    return QuantizedTensor(
        bits=4,
        group_size=group,
        shape=shape,
        packed=packed,
        scales=scales.half(),
        minimums=(-zeros.float() * scales).half(),
    )


def _split(names: list[str], parts: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the quantized layers' prefixes, in order, the other tensors' names)."""
    layers: dict[str, None] = {}
    rest = []
    for name in names:
        prefix, _, part = name.rpartition(".")
        if part in parts:
            layers[prefix] = None
        else:
            rest.append(name)
    return list(layers), rest


def load(
    config: ModelConfig,
    tokenizer: Tokenizer | None,
    names: list[str],
    read: Callable[[str], torch.Tensor],
    scheme: Int4Scheme,
    description: str,
    arranged: Callable[[WeightIterator], WeightIterator] = lambda tensors: tensors,
) -> ModelSource:
    """A ModelSource over a 4-bit checkpoint (`names`: its tensors', `read(name)` one of them): its 4-bit
    layers as QuantizedTensors (the GPU keeps them packed), the rest as stored (`arranged`); weights() gives
    every matrix dequantized (the CPU, `ninfer convert`)."""
    layers, rest = _split(names, PARTS[scheme.method])
    present = set(names)

    def quantized() -> Iterator[tuple[str, QuantizedTensor]]:
        for prefix in layers:
            parts = {p: read(f"{prefix}.{p}") for p in PARTS[scheme.method] if f"{prefix}.{p}" in present}
            yield f"{prefix}.weight", to_groupwise(parts, scheme, prefix)

    def unquantized() -> WeightIterator:  # (`arranged`: in the layout the engine holds, as hf_dir streams)
        return arranged((name, read(name)) for name in rest)

    def weights() -> WeightIterator:
        yield from unquantized()
        for name, qt in quantized():
            yield name, dequantize(qt)

    return ModelSource(
        config,
        tokenizer,
        weights,
        f"{description}, {scheme.label}",
        {f"{prefix}.weight": 4 for prefix in layers},
        quantized_weights=quantized,
        unquantized_weights=unquantized,
    )
