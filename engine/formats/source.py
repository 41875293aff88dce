"""What every model format hands the loader: a config, a tokenizer and a stream of named tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import ModelConfig
from engine.tokenizer import Tokenizer

WeightIterator = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class ModelSource:
    config: ModelConfig
    tokenizer: Tokenizer | None
    # called once by the loader; yields (HF-style tensor name, tensor) one at a time so that a large
    # checkpoint never needs twice its size in memory
    weights: Callable[[], WeightIterator]
    description: str
    # bits per weight of checkpoint tensors stored quantized (GGUF blocks), by the names weights() yields
    tensor_bits: dict[str, int] = field(default_factory=dict)
    # .ninfer and block-quantized GGUF: the quantized tensors (QuantizedTensor), and the other tensors, for
    # loaders that keep weights quantized (the fused dequant kernels); weights() yields everything dequantized
    quantized_weights: Callable[[], Iterator[tuple[str, Any]]] | None = None
    unquantized_weights: Callable[[], WeightIterator] | None = None
    # the width its matrices are stored at where weights() streams them dequantized (FP8, NVFP4, int8 a
    # tensor: no kernel of their own): weight_quant auto holds them at 8 bits (GPU groups, CPU int8)
    # (engine/quant/on_load.py)
    stored_bits: int | None = None
    # NVFP4 / MXFP4: (quantized, unquantized) as quantized_weights / unquantized_weights would be, the FP4
    # matrices as stored (engine/formats/hf_fp4.Fp4Tensor): where the fused kernels run, weight_quant auto
    # holds them so (engine/models/loader.quantized_at_load); elsewhere weights() streams them dequantized
    native_weights: tuple[Callable[[], Iterator[tuple[str, Any]]], Callable[[], WeightIterator]] | None = None
