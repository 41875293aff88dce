"""Integer-quantized HF checkpoints read as ninfer's own groups, so the fused W4A16 / W8A16 kernels multiply
them as they are: AWQ, GPTQ and compressed-tensors at 4 bits (Qwen's `-AWQ` and `-GPTQ-Int4` releases,
AutoAWQ's, GPTQModel's and llm-compressor's W4A16), and symmetric 8-bit GPTQ and compressed-tensors
(`-GPTQ-Int8`, llm-compressor's W8A16 and W8A8, whose int8 activations are not needed: they stay 16-bit).

AWQ and GPTQ store a linear layer's W [N, K] as `qweight` (int32 words of eight 4-bit codes), `qzeros`
(the groups' zero points, packed the same way) and fp16 `scales` [K / G, N], groups of G input columns:
w[n, k] = (q[k, n] - z[k / G, n]) * s[k / G, n].
* AWQ (`version: gemm`): qweight [K, N / 8] packed along the output dimension in AutoAWQ's order (the
  word's nibble i holds column 8 c + (0, 2, 4, 6, 1, 3, 5, 7)[i]), qzeros [K / G, N / 8] alike.
* GPTQ: qweight [K / 8, N] packed along the input dimension (nibble i of word r holds row 8 r + i), qzeros
  [K / G, N / 8] along the output one; the original format (`checkpoint_format: gptq`) stores each zero
  point minus one, `gptq_v2` as it is; `g_idx` gives each row's group.
* compressed-tensors (`format: pack-quantized`, 4-bit int weights, group or channel strategy):
  `weight_packed` [N, K / 8] packed along the input dimension (nibble i of word c holds column 8 c + i),
  each code stored plus 8; `weight_scale` [N, K / G]; `weight_zero_point` [N / 8, K / G] packed along
  the output dimension, plus 8 too (asymmetric schemes; a symmetric one has none: 8); `weight_shape` (N, K).
* 8 bits, symmetric only (ninfer's 8-bit groups are q * scale): GPTQ's qweight [K / 4, N] holds a byte a row
  (byte i of word r: row 4 r + i), each code plus 128 (its zero point, stored as 127 in the original
  format); compressed-tensors' `weight_packed` [N, K / 4] a byte a column, plus 128; its `int-quantized`
  format (W8A8) the int8 `weight` itself with a `weight_scale` per row or per group (a row's scale is
  repeated over ninfer's groups of 128).
ninfer's groups (engine/quant/groupwise.py) hold w = q * scale + minimum: the codes and scales are the
checkpoint's, the minimum -z * s (rounded once to fp16: within 1% of a code step). Matrices the tool left in
16 bits (lm_head, embeddings, a router) stream as they are. An act-order checkpoint (GPTQ's desc_act,
compressed-tensors' actorder "group") scatters each group over the input columns (`g_idx`: each column's
group): its columns are stored sorted by group, so the groups are contiguous as the kernels take them, with
the order kept (QuantizedTensor.columns): the matmul kernels load the input's columns in that order
(kernels/quant_matmul's `columns`), and dequantizing puts them back. Qwen3-Next's fused input projections
(in_proj_qkvz, in_proj_ba), quantized whole, are split into Qwen3.5's parts by rows, still packed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats import qwen3_next
from engine.formats.gguf_blocks import select
from engine.formats.source import ModelSource, WeightIterator
from engine.quant.groupwise import QuantizedTensor, dequantize, fitting_group, pack
from engine.tokenizer import Tokenizer

# a layer's tensors, by method, the first the one every quantized layer has: (codes, zero points, scales,
# group index, shape); W8A8's codes are its `weight`, so its layers are found by their scale
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
    "int8": ("weight_scale", "weight", "weight_zero_point", "weight_g_idx"),
}
CT = "compressed-tensors"
INT8 = "int8"  # compressed-tensors' int-quantized format
ROW_GROUP = 128  # the group a scale per row is spread over
AWQ_COLUMNS = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a word's eight is its nibble AWQ_COLUMNS[j]


@dataclass(frozen=True)
class IntScheme:
    method: str  # "awq", "gptq", "compressed-tensors" or "int8"
    group_size: int  # input columns a group (-1: the whole row)
    zero_offset: int  # added to a stored zero point (GPTQ's original format stores it minus one)
    bits: int = 4
    act_order: bool = False  # groups scattered over the input columns (g_idx): stored sorted by group

    @property
    def label(self) -> str:
        name = {"awq": "AWQ", "gptq": "GPTQ", INT8: "compressed-tensors"}.get(self.method, self.method)
        return f"{name} {self.bits}-bit" + (" act-order" if self.act_order else "")


def int_scheme(quant: dict[str, Any], method: str, architecture: str, where: str) -> IntScheme:
    """The scheme of an AWQ / GPTQ quantization_config, or a one-line refusal of what ninfer cannot read."""
    bits, group = quant.get("bits", quant.get("w_bit")), quant.get("group_size", quant.get("q_group_size"))
    widths = (4,) if method == "awq" else (4, 8)
    if bits not in widths:
        raise NinferError(
            f"{where} is {method} at {bits} bits; ninfer reads {' and '.join(map(str, widths))}-bit "
            f"{method.upper()} checkpoints"
        )
    if not isinstance(group, int) or not (group == -1 or group > 0):
        raise NinferError(f"{where}: its {method} group_size {group!r} is not a positive whole number or -1")
    if method in (CT, INT8):
        return IntScheme(method, group, 0, bits)
    if method == "awq":
        version = str(quant.get("version", "gemm")).lower()
        if version != "gemm" or quant.get("zero_point", True) is not True:
            raise NinferError(
                f"{where} is AWQ {version}{'' if quant.get('zero_point', True) else ' without zero points'}; "
                "ninfer reads AWQ's gemm layout with zero points (AutoAWQ's default)"
            )
        return IntScheme("awq", group, 0)
    fmt = str(quant.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise NinferError(f"{where} is GPTQ in the {fmt} format; ninfer reads the gptq and gptq_v2 formats")
    if bits == 8 and quant.get("sym") is False:
        raise NinferError(f"{where} is asymmetric 8-bit GPTQ; ninfer reads 8-bit GPTQ made with sym: true")
    return IntScheme("gptq", group, 1 if fmt == "gptq" else 0, bits, bool(quant.get("desc_act")))


AUTO_ROUND_GPTQ = ("auto_round:auto_gptq", "auto_round:gptq", "auto_gptq", "gptq")
AUTO_ROUND_AWQ = ("auto_round:auto_awq", "auto_awq", "awq")


def auto_round_scheme(quant: dict[str, Any], architecture: str, where: str) -> IntScheme:
    """Intel AutoRound's integer checkpoints: packed as AutoGPTQ packs them (`packing_format`
    `auto_round:auto_gptq`, the default: GPTQ's original format, zero points stored minus one) or as AutoAWQ
    does (`auto_round:auto_awq`); read as those."""
    packing = str(quant.get("packing_format") or "auto_round:auto_gptq").lower()
    data_type = str(quant.get("data_type") or "int").lower()
    if data_type != "int" or packing not in AUTO_ROUND_GPTQ + AUTO_ROUND_AWQ:
        raise NinferError(
            f"{where} is AutoRound {data_type} packed as {packing}; ninfer reads AutoRound's integer checkpoints "
            "packed auto_round:auto_gptq or auto_round:auto_awq"
        )
    if packing in AUTO_ROUND_AWQ:
        return int_scheme({**quant, "version": "gemm", "zero_point": True}, "awq", architecture, where)
    return int_scheme({**quant, "checkpoint_format": "gptq"}, "gptq", architecture, where)


def compressed_tensors_scheme(quant: dict[str, Any], architecture: str, where: str) -> IntScheme | None:
    """The scheme of a compressed-tensors config (`pack-quantized`: 4- or symmetric 8-bit integers;
    `int-quantized`: symmetric 8-bit) whose weights are all one width in one group size (None where they are
    not: refused by the caller)."""
    packed = quant.get("format") == "pack-quantized"
    weights = [g.get("weights") or {} for g in (quant.get("config_groups") or {}).values()]
    widths = {w.get("num_bits") for w in weights}
    if not weights or any(w.get("type") != "int" for w in weights) or len(widths) != 1:
        return None
    bits = widths.pop()
    if bits not in ((4, 8) if packed else (8,)) or (
        bits == 8 and not all(w.get("symmetric") for w in weights)
    ):
        return None
    if not packed and any(w.get("strategy") not in ("group", "channel") for w in weights):
        return None  # (int8 per tensor: dequantized as it streams, engine/formats/hf_quant.py)
    groups = {w.get("group_size") if w.get("strategy") == "group" else -1 for w in weights}
    if len(groups) != 1 or any(w.get("strategy") not in ("group", "channel") for w in weights):
        raise NinferError(
            f"{where}: its {bits}-bit groups mix strategies or sizes ({sorted(map(str, groups))})"
        )
    method = CT if packed else INT8
    scheme = int_scheme({"bits": bits, "group_size": groups.pop()}, method, architecture, where)
    # (actorder "group" stores each column's group; "weight" / "static" only ordered the quantization:
    # their groups are contiguous)
    act_order = any(w.get("actorder") in ("group", True) for w in weights)
    return replace(scheme, act_order=act_order)


def _bytes(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., 4 W]: byte j of word w (bits 8 j .. 8 j + 7, little-endian) at 4 w + j.
    Its two nibbles are codes 2 j and 2 j + 1 of the word: ninfer's packing of an (even, odd) pair."""
    assert sys.byteorder == "little"
    w = words.to(torch.int32)  # (flattened first: a [R, 1] transpose is "contiguous" with a stride of R)
    return w.reshape(-1).contiguous().view(torch.uint8).reshape(*w.shape[:-1], 4 * w.shape[-1])


def _row_bytes(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ's qweight [R, N], words packed along the input dimension -> uint8 [N, 4 R]: each column's bytes
    in row order (at 4 bits ninfer's packed pairs, at 8 the codes)."""
    rows, n = qweight.shape
    return _bytes(qweight).view(rows, n, 4).permute(1, 0, 2).reshape(n, 4 * rows)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> codes [..., 8 W] (uint8): nibble i of word w at 8 w + i."""
    b = _bytes(words)
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def _awq_columns(words: torch.Tensor) -> torch.Tensor:
    """AWQ's words [R, N / 8] -> codes [R, N], columns in order."""
    codes = _nibbles(words)
    return codes.view(*codes.shape[:-1], -1, 8)[..., list(AWQ_COLUMNS)].flatten(-2)


def to_groupwise(parts: dict[str, torch.Tensor], scheme: IntScheme, name: str) -> QuantizedTensor:
    """One linear layer's tensors (PARTS, by their last names) as a QuantizedTensor of W [N, K]."""
    needed = {CT: ("weight_packed", "weight_scale"), INT8: ("weight", "weight_scale")}
    missing = [p for p in needed.get(scheme.method, PARTS[scheme.method][:3]) if p not in parts]
    if missing:
        raise NinferError(f"{name}: the checkpoint lacks its {', '.join(missing)}; download it again")
    g_idx = parts.get("g_idx" if scheme.method == "gptq" else "weight_g_idx")
    if scheme.method != "awq" and g_idx is not None and bool((g_idx[1:] < g_idx[:-1]).any()):  # act-order
        return _act_order(parts, scheme, name, g_idx.long())
    if scheme.bits == 8:
        return _eight_bit(parts, scheme, name)
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
        packed = _row_bytes(qweight)
    zeros = zeros.to(torch.int32) + scheme.zero_offset
    return _groupwise(packed, scales.t(), zeros.t(), group, (n, k))


def _compressed_tensors(parts: dict[str, torch.Tensor], scheme: IntScheme, name: str) -> QuantizedTensor:
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


def _eight_bit(parts: dict[str, torch.Tensor], scheme: IntScheme, name: str) -> QuantizedTensor:
    """A symmetric 8-bit layer as ninfer's 8-bit groups: int8 codes [N, Kp] and a scale a group."""
    if scheme.method == "gptq":  # qweight [K / 4, N], a byte a row; qzeros [K / G, N / 4]; scales [K / G, N]
        qweight, scales = parts["qweight"], parts["scales"].t()
        codes = _row_bytes(qweight)
        n, k = codes.shape
        zeros = _bytes(parts["qzeros"]).view(parts["qzeros"].shape[0], -1).int() + scheme.zero_offset
        if zeros.shape != (scales.shape[1], n) or bool((zeros != 128).any()):
            raise NinferError(
                f"{name}: its zero points are not all 128 (asymmetric), which ninfer does not read"
            )
        g_idx = parts.get("g_idx")
    elif scheme.method == CT:  # weight_packed [N, K / 4], a byte a column; weight_scale [N, K / G]
        words, scales = parts["weight_packed"], parts["weight_scale"]
        codes = _bytes(words).view(words.shape[0], -1)
        shape = parts.get("weight_shape")
        n, k = codes.shape[0], int(shape[1]) if shape is not None else codes.shape[1]
        codes, g_idx = codes[:, :k], parts.get("weight_g_idx")
    else:  # int-quantized: the int8 weight [N, K]; weight_scale [N, K / G], [N, 1] or one
        codes, scales, g_idx = parts["weight"], parts["weight_scale"], parts.get("weight_g_idx")
        n, k = codes.shape
    if codes.dtype == torch.uint8:  # stored plus 128
        codes = (codes ^ 0x80).view(torch.int8)
    scales = (
        scales.float().reshape(n, -1) if scales.numel() > 1 else scales.float().reshape(1, 1).expand(n, 1)
    )
    stored_group = k if scheme.group_size == -1 else scheme.group_size
    if codes.dtype != torch.int8 or scales.shape[0] != n or scales.shape[1] != -(-k // stored_group):
        raise NinferError(
            f"{name}: its codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not make one {n} x {k} "
            f"matrix in groups of {stored_group}; download it again"
        )
    _check_groups(g_idx, k, stored_group, f"{name} group index")
    group = stored_group
    if scales.shape[1] == 1:  # a scale a row, spread over groups the kernels take
        group = fitting_group(k, ROW_GROUP)
        scales = scales.expand(n, -(-k // group))
    kp = scales.shape[1] * group
    return QuantizedTensor(
        bits=8,
        group_size=group,
        shape=(n, k),
        packed=torch.nn.functional.pad(codes, (0, kp - k)).contiguous(),
        scales=scales.half().contiguous(),
        minimums=None,
    )


def _act_order(
    parts: dict[str, torch.Tensor], scheme: IntScheme, name: str, g: torch.Tensor
) -> QuantizedTensor:
    """An act-order layer (w[n, k] = (q - z) * s of group g[k]) as ninfer's groups of its columns sorted by
    group, their order in `columns`."""
    if scheme.method == "gptq":  # qweight [K / per, N], qzeros [G, N / per], scales [G, N]
        qweight = parts["qweight"]
        if scheme.bits == 4:
            codes, zeros = _nibbles(qweight.t()), _nibbles(parts["qzeros"]).t()  # [N, K], [N, G]
        else:
            codes = _row_bytes(qweight)
            zeros = _bytes(parts["qzeros"]).view(parts["qzeros"].shape[0], -1).t()
        zeros, scales = zeros.int() + scheme.zero_offset, parts["scales"].float().t()
    elif scheme.method == INT8:  # the int8 weight [N, K], weight_scale [N, G]
        codes, scales = parts["weight"], parts["weight_scale"].float()
        zeros = torch.zeros(scales.shape, dtype=torch.int32)
    else:  # compressed-tensors: weight_packed [N, K / per], weight_scale [N, G], weight_zero_point [N / per, G]
        words, scales = parts["weight_packed"], parts["weight_scale"].float()
        codes = _nibbles(words) if scheme.bits == 4 else _bytes(words).view(words.shape[0], -1)
        zero_point = parts.get("weight_zero_point")
        if zero_point is None:
            zeros = torch.full(scales.shape, 8 if scheme.bits == 4 else 128)
        else:
            zeros = _nibbles(zero_point.t()).t()[: scales.shape[0]]
    n, k = codes.shape[0], g.numel()
    if (
        codes.shape[1] < k
        or scales.shape[0] != n
        or int(g.min()) < 0
        or int(g.max()) >= scales.shape[1]
        or zeros.shape != scales.shape
    ):
        raise NinferError(
            f"{name}: its codes, scales and group index do not make one matrix; download it again"
        )
    group = k if scheme.group_size == -1 else scheme.group_size
    columns = torch.argsort(g, stable=True)  # [K]: the input column of each stored one
    if not torch.equal(g[columns], torch.arange(k) // group) or scales.shape[1] != -(-k // group):
        raise NinferError(
            f"{name}'s group index does not give each group {group} columns, which ninfer does not read"
        )
    kp = scales.shape[1] * group
    codes = torch.nn.functional.pad(codes[:, columns], (0, kp - k))  # [N, Kp] as stored, groups in order
    if scheme.bits == 4:
        qt = _groupwise(pack(codes, 4), scales, zeros, group, (n, k))
    else:  # ninfer's 8-bit groups are symmetric (q * s): unsigned codes stored plus 128, signed as they are
        if bool((zeros != (128 if codes.dtype == torch.uint8 else 0)).any()):
            raise NinferError(
                f"{name}: its zero points are not all 128 (asymmetric), which ninfer does not read"
            )
        codes = (codes ^ 0x80).view(torch.int8) if codes.dtype == torch.uint8 else codes
        qt = QuantizedTensor(8, group, (n, k), codes.contiguous(), scales.half().contiguous(), None)
    return replace(qt, columns=columns.to(torch.int32))


def _check_groups(g_idx: torch.Tensor | None, k: int, group: int, name: str) -> None:
    """A group index in order must put `group` input columns in each group (act-order's: _act_order)."""
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // group):
        raise NinferError(f"{name} does not give each group {group} columns, which ninfer does not read")


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
    """(the quantized layers' prefixes, in order: those with parts[0]; the other tensors' names)."""
    layers = {name.rpartition(".")[0]: None for name in names if name.rpartition(".")[2] == parts[0]}
    rest = [n for n in names if not (n.rpartition(".")[0] in layers and n.rpartition(".")[2] in parts)]
    return list(layers), rest


def _held_names(name: str, config: ModelConfig) -> list[str]:
    """The names a quantized layer's weight loads as: its own, or a Qwen3-Next fused projection's parts."""
    parts = qwen3_next.fused_parts(name, config)
    return [name] if parts is None else [part for part, _ in parts]


def load(
    config: ModelConfig,
    tokenizer: Tokenizer | None,
    names: list[str],
    read: Callable[[str], torch.Tensor],
    scheme: IntScheme,
    description: str,
    arranged: Callable[[WeightIterator], WeightIterator] = lambda tensors: tensors,
) -> ModelSource:
    """A ModelSource over a 4- or 8-bit checkpoint (`names`: its tensors', `read(name)` one of them): its
    quantized layers as QuantizedTensors (the GPU keeps them packed), the rest as stored (`arranged`);
    weights() gives every matrix dequantized (the CPU, `ninfer convert`)."""
    layers, rest = _split(names, PARTS[scheme.method])
    present = set(names)
    tensor_bits = {name: scheme.bits for prefix in layers for name in _held_names(f"{prefix}.weight", config)}

    def layer_parts(prefix: str) -> dict[str, torch.Tensor]:
        return {p: read(f"{prefix}.{p}") for p in PARTS[scheme.method] if f"{prefix}.{p}" in present}

    def unquantized() -> WeightIterator:  # (`arranged`: in the layout the engine holds, as hf_dir streams)
        return arranged((name, read(name)) for name in rest)

    def quantized() -> Iterator[tuple[str, QuantizedTensor]]:
        for prefix in layers:
            qt = to_groupwise(layer_parts(prefix), scheme, prefix)
            name = f"{prefix}.weight"
            parts = qwen3_next.fused_parts(name, config)
            if parts is None:
                yield name, qt
                continue
            # Qwen3-Next's fused input projections: each part's rows, still packed (as Qwen3.5's layout)
            for part, rows in parts:
                yield part, select(qt, 0, rows)

    def weights() -> WeightIterator:
        yield from unquantized()
        for name, qt in quantized():
            yield name, dequantize(qt)

    return ModelSource(
        config,
        tokenizer,
        weights,
        f"{description}, {scheme.label}",
        tensor_bits,
        quantized_weights=quantized,
        unquantized_weights=unquantized,
    )
