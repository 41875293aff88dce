"""The served LoRA adapters: loaded onto the model's layers once, chosen per request by name.

A request names its adapter in `SamplingParams.adapter` (the API: the request's `model`). A step's rows
are grouped by adapter (`step_rows`), and each layer an adapter targets adds its low-rank delta to those
rows (engine/lora/layer.py); the base weights stay as they are, so requests with different adapters, or
none, share a batch. An adapter's prompt pages are its own in the prefix cache
(engine/lora/spec.adapter_cache_root).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from engine.layers.linear import Linear
from engine.lora.layer import LoraWeights
from engine.lora.peft import read_adapter
from engine.transfer import to_device


class Adapters:
    def __init__(self, model: torch.nn.Module, modules: tuple[tuple[str, str], ...], dtype, device):
        self.slots: dict[str, int] = {}
        self.paths: dict[str, str] = {}
        self.ranks: dict[str, int] = {}
        self.device = torch.device(device)
        for slot, (name, path) in enumerate(modules):
            by_module = defaultdict(list)
            pairs = read_adapter(name, path, model)
            for pair in pairs:
                by_module[pair.module].append(pair)
            for module_name, module_pairs in by_module.items():
                layer: Linear = model.get_submodule(module_name)
                if layer.lora is None:
                    layer.lora = LoraWeights(layer.out_features)
                layer.lora.add_adapter(slot, module_pairs, dtype, self.device)
            self.slots[name], self.paths[name] = slot, path
            self.ranks[name] = max(p.a.shape[0] for p in pairs)
        self._layers = [m.lora for m in model.modules() if isinstance(m, Linear) and m.lora is not None]

    @property
    def names(self) -> list[str]:
        return list(self.slots)

    @property
    def num_bytes(self) -> int:
        return sum(layer.num_bytes for layer in self._layers)

    def step_rows(self, scheduled, cu_seqlens: list[int]) -> tuple[tuple[int, torch.Tensor | None], ...]:
        """(slot, rows [n] int64 on the device, or None for every row) of each adapter in the step."""
        rows: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(scheduled):
            name = r.sampling_params.adapter
            if name is not None:
                rows[self.slots[name]].extend(range(cu_seqlens[i], cu_seqlens[i + 1]))
        total = cu_seqlens[-1]
        return tuple(
            (slot, None if len(ids) == total else to_device(ids, torch.int64, self.device))
            for slot, ids in rows.items()
        )
