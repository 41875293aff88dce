"""An HF checkpoint another tool quantized, as its config.json's `quantization_config` says.

FP8 is read: Qwen's (and DeepSeek's) `-FP8` releases (`quant_method: fp8`, e4m3 codes in blocks of
`weight_block_size`, 128 x 128, each block's `weight_scale_inv` to multiply by), and llm-compressor's
float8 (`quant_method: compressed-tensors`, format `float-quantized`: a `weight_scale` per tensor, per output
channel or per block). Each FP8 matrix is dequantized as the tensors stream (its scale read from whichever
shard holds it), so what loads, converts and quantizes is the bf16 checkpoint the FP8 one was made from,
within FP8's rounding; the activation scales are not needed (activations stay 16-bit). A matrix the tool
left unquantized (lm_head, the router, norms) streams as it is. AWQ, GPTQ and compressed-tensors 4- and 8-bit
checkpoints are read as they are (engine/formats/hf_intq.py), NVFP4 ones dequantized as they stream
(engine/formats/hf_fp4.py), Model Optimizer's FP8 as FP8 (a scale a tensor). Every other method (bitsandbytes,
compressed-tensors' other integer schemes, ...) is refused in one sentence, before any weight is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from engine.errors import NinferError
from engine.formats.hf_fp4 import Fp4Scheme, fp4_scheme
from engine.formats.hf_intq import IntScheme, auto_round_scheme, compressed_tensors_scheme, int_scheme

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# tensors of a quantized checkpoint the engine does not load: the activations' (static) scales, an FP8 KV
# cache's scales
_UNUSED_SUFFIXES = (".input_scale", ".activation_scale", ".k_scale", ".v_scale", ".kv_scale")


@dataclass(frozen=True)
class ScaledScheme:
    """Codes times their scales, dequantized as the tensors stream (FP8; compressed-tensors' int8)."""

    label: str  # "FP8" or "INT8", as `plan` and the Ollama routes name it
    # the scale's name after its weight's: `weight_scale_inv` (the fp8 method; it multiplies, as
    # compressed-tensors' `weight_scale` does)
    scale_suffix: str
    block: tuple[int, int] | None  # (rows, columns) of a scale's block; None: per tensor or per output row

    @property
    def codes(self) -> tuple[torch.dtype, ...]:
        """The dtypes of the matrices stored as codes (others stream as they are)."""
        return FP8_DTYPES if self.label == "FP8" else (torch.int8,)


def checkpoint_quantization(cfg: dict[str, Any], where: str) -> ScaledScheme | IntScheme | Fp4Scheme | None:
    """How a config.json dict's checkpoint is quantized: FP8 or int8 codes times scales (dequantized as they
    stream), NVFP4 (engine/formats/hf_fp4.py, dequantized too), AWQ / GPTQ / compressed-tensors 4-bit
    (engine/formats/hf_intq.py),
    or None for an unquantized one; a quantization ninfer does not read is refused, saying what to give
    instead."""
    quant = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    if not quant:
        return None
    method = str(quant.get("quant_method", "?")).lower()
    architecture = (cfg.get("architectures") or ["?"])[0]
    if method in ("awq", "gptq"):
        return int_scheme(quant, method, architecture, where)
    if method in ("auto-round", "autoround", "intel/auto-round"):
        return auto_round_scheme(quant, architecture, where)
    if method == "modelopt" and str(quant.get("quant_algo", "")).upper() == "FP8":  # a scale a tensor
        return ScaledScheme("FP8", "_scale", None)
    fp4 = fp4_scheme(quant, where)
    if fp4 is not None:
        return fp4
    if method == "compressed-tensors" and quant.get("format") in ("pack-quantized", "int-quantized"):
        scheme = compressed_tensors_scheme(quant, architecture, where)
        if scheme is not None:
            return scheme
    if method == "fp8":
        block = quant.get("weight_block_size")
        return ScaledScheme("FP8", "_scale_inv", _block(block, where) if block else None)
    if method == "compressed-tensors" and quant.get("format") in (
        "float-quantized",
        "int-quantized",
        "naive-quantized",
    ):
        scheme = _scaled_8bit(quant, where)
        if scheme is not None:
            return scheme
        method = f"compressed-tensors {quant.get('format')}"
    elif method == "compressed-tensors":
        method = f"compressed-tensors {quant.get('format', '?')}"
    raise NinferError(
        f"{where} was quantized by another tool (quantization_config: {method}), which ninfer does not read; "
        "give the model's bf16 checkpoint (or its FP8, AWQ or GPTQ-Int4 release, or a GGUF file); ninfer "
        "quantizes with `ninfer convert --recipe q4.6|w4g128|w8g128`"
    )


def _scaled_8bit(quant: dict[str, Any], where: str) -> ScaledScheme | None:
    """compressed-tensors' float8 or symmetric int8 weights (one kind, one block shape: a block, a group of
    one row's columns, a row or the tensor), or None for anything else."""
    weights = [g.get("weights") or {} for g in (quant.get("config_groups") or {}).values()]
    kinds = {w.get("type") for w in weights}
    if (
        not weights
        or len(kinds) != 1
        or not kinds <= {"float", "int"}
        or any(w.get("num_bits") != 8 for w in weights)
    ):
        return None
    if kinds == {"int"} and not all(w.get("symmetric", True) for w in weights):
        return None  # (zero points: not read)
    blocks = set()
    for w in weights:
        if w.get("block_structure"):
            blocks.add(tuple(w["block_structure"]))
        elif w.get("strategy") == "group":
            blocks.add((1, w.get("group_size")))
        else:
            blocks.add(None)
    if len(blocks) > 1:
        raise NinferError(
            f"{where}: its 8-bit groups use different blocks {sorted(map(str, blocks))}; ninfer reads one"
        )
    block = blocks.pop()
    return ScaledScheme(
        "FP8" if kinds == {"float"} else "INT8", "_scale", _block(list(block), where) if block else None
    )


def _block(block: Any, where: str) -> tuple[int, int]:
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise NinferError(f"{where}: its scales' block size {block!r} is not two positive integers")
    return block[0], block[1]


def dequantized(
    tensors: Iterator[tuple[str, torch.Tensor]],
    read: Callable[[str], torch.Tensor | None],
    scheme: ScaledScheme,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with every matrix of codes (FP8, int8) dequantized to bf16 (`read(name)`: any
    tensor of the checkpoint by name, None where it has none); the scales themselves are not passed on."""
    for name, tensor in tensors:
        if name.endswith(scheme.scale_suffix) or name.endswith(_UNUSED_SUFFIXES):
            continue
        if tensor.dtype in scheme.codes:
            scale = read(name + scheme.scale_suffix)
            if scale is None:
                raise NinferError(
                    f"{name} is {scheme.label} but the checkpoint has no {name + scheme.scale_suffix}; download "
                    "it again"
                )
            tensor = dequantize_scaled(tensor, scale, scheme.block, name)
        yield name, tensor


def dequantize_scaled(
    codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None, name: str = "the matrix"
) -> torch.Tensor:
    """codes [..., N, K] (FP8 or int8) times their scale: per block [..., ceil(N / bn), ceil(K / bk)], per output row
    [..., N, 1] / [..., N], or one for the tensor; in fp32, returned as bf16."""
    *lead, n, k = codes.shape
    s = scale.float()
    if block is not None:
        rows, cols = -(-n // block[0]), -(-k // block[1])
        if tuple(s.shape) != (*lead, rows, cols):
            raise NinferError(
                f"{name}: its scale is {tuple(s.shape)}, but {block[0]} x {block[1]} blocks of a "
                f"{tuple(codes.shape)} matrix need {(*lead, rows, cols)}"
            )
        if n % block[0] == 0 and k % block[1] == 0:  # whole blocks: one broadcast multiply, no expanded scale
            blocks = codes.view(*lead, rows, block[0], cols, block[1]).float()
            return blocks.mul_(s[..., :, None, :, None]).to(torch.bfloat16).view(codes.shape)
        s = s.repeat_interleave(block[0], -2)[..., :n, :].repeat_interleave(block[1], -1)[..., :k]
    elif s.numel() == 1:
        s = s.reshape([1] * codes.dim())
    elif s.numel() == codes.numel() // k:  # one a row
        s = s.reshape(*lead, n, 1)
    else:
        raise NinferError(f"{name}: its scale {tuple(scale.shape)} fits neither the tensor nor its rows")
    return (codes.float() * s).to(torch.bfloat16)
