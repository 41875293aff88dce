"""A llama.cpp LoRA adapter (a GGUF of `general.type` adapter, as convert_lora_to_gguf.py writes it) read
into the same low-rank pairs as a PEFT folder.

Tensors are `blk.N.<module>.weight.lora_a` ([r, in]) and `.lora_b` ([out, r]), named as the base GGUF's
weights (engine/formats/gguf.py maps them to the checkpoint's names); scale = adapter.lora.alpha / r (1
when alpha is 0, as llama.cpp takes it). For a `llama` adapter the converter interleaved the rows of q's
and k's B as it does the base weights' (rotate-half -> GGML pairs): undone here as the loader undoes them.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from engine.errors import NinferError
from engine.formats.gguf import HYBRID, _field, _hf_name, _open, _shape, _unpermute
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
    if arch in HYBRID:
        raise NinferError(
            f"LoRA adapter '{name}': {path} is a {arch} adapter GGUF, whose linear-attention tensors the "
            "converter reorders; give the peft folder it was converted from"
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
        target = hf[: -len(".weight")]
        if half == "lora_b" and arch == "llama" and target.endswith(("self_attn.q_proj", "self_attn.k_proj")):
            heads = config.num_attention_heads if target.endswith("q_proj") else config.num_key_value_heads
            tensor = _unpermute(tensor, heads)
        halves.setdefault(target, {})["A" if half == "lora_a" else "B"] = tensor
    if not halves:
        raise NinferError(f"LoRA adapter '{name}' ({path}) holds no LoRA matrices")
    alpha = float(_field(reader, "adapter.lora.alpha", 0.0) or 0.0)
    base = f"a {arch} model"
    return low_rank_pairs(name, halves, model, base, lambda target, r: alpha / r if alpha else 1.0)
