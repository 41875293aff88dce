"""A llama.cpp LoRA adapter (a GGUF of `general.type` adapter, as convert_lora_to_gguf.py writes it) read
into the same low-rank pairs as a PEFT folder.

Tensors are `blk.N.<module>.weight.lora_a` ([r, in]) and `.lora_b` ([out, r]), named as the base GGUF's
weights (engine/formats/gguf.py maps them to the checkpoint's names); scale = adapter.lora.alpha / r (1
when alpha is 0, as llama.cpp takes it). Where the converter reorders a base weight's rows (a `llama`
adapter's q and k: rotate-half -> GGML pairs; a `qwen35` one's value heads, grouped -> tiled) it reorders
B's rows, and where the columns (Qwen3.5's out_proj) A's: both undone here as the loader undoes them.
(llama.cpp's own converter writes Qwen3.5 adapters of the attention and MLP layers only.)
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from engine.errors import NinferError
from engine.formats.gguf import HYBRID, TILED, _field, _hf_name, _open, _order, _shape
from engine.lora.peft import LoraPair, low_rank_pairs


def read_gguf_adapter(name: str, path: str, model) -> list[LoraPair]:
    reader = _open(Path(path))
    kind, adapter = _field(reader, "general.type"), _field(reader, "adapter.type")
    if kind != "adapter" or adapter != "lora":
        what = f"a {adapter} adapter" if kind == "adapter" else "a model, not an adapter"
        raise NinferError(
            f"LoRA adapter '{name}': {path} is {what}; give a LoRA adapter GGUF or a peft folder"
        )
    arch = _field(reader, "general.architecture")
    if arch in HYBRID and arch not in TILED:
        raise NinferError(
            f"LoRA adapter '{name}': {path} is a {arch} adapter GGUF, whose fused linear-attention "
            "projections are not read as adapters; give the peft folder it was converted from"
        )
    config = model.config
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for t in reader.tensors:
        weight, _, half = t.name.rpartition(".")
        hf = _hf_name(weight, config.num_hidden_layers) if half in ("lora_a", "lora_b") else None
        if hf is None or not hf.endswith(".weight"):
            raise NinferError(
                f"LoRA adapter '{name}' holds {t.name}, which is not a LoRA matrix of a layer ninfer reads"
            )
        values = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        tensor = torch.from_numpy(values).reshape(_shape(t))
        # the converter moved the base weight's rows (or columns) as it moved the factor's: B's rows (A's
        # columns) go back as the loader puts the weight's back (_order: llama's q / k, the value heads)
        order = _order(arch, hf, config)
        if order is not None and order[0] == (0 if half == "lora_b" else 1):
            tensor = tensor.index_select(*order)
        halves.setdefault(hf[: -len(".weight")], {})["A" if half == "lora_a" else "B"] = tensor
    if not halves:
        raise NinferError(f"LoRA adapter '{name}' ({path}) holds no LoRA matrices")
    alpha = float(_field(reader, "adapter.lora.alpha", 0.0) or 0.0)
    base = f"a {arch} model"
    return low_rank_pairs(name, halves, model, base, lambda target, r: alpha / r if alpha else 1.0)
