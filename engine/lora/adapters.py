"""The served LoRA adapters: loaded onto the model's layers, chosen per request by name.

A request names its adapter in `SamplingParams.adapter` (the API: the request's `model`), or a weighted mix
of them in `SamplingParams.adapter_scales` (llama.cpp's way). A step's rows are grouped by adapter and scale
(`step_rows`), and each layer an adapter targets adds its low-rank delta, times the scale, to those rows
(engine/lora/layer.py); the base weights stay as they are, so requests with different adapters, or none,
share a batch. Each load of an adapter roots its own prefix-cache hash chain (`cache_root`; a mix, one of
its adapters' roots and scales), so its pages are never the base model's, another adapter's or mix's, or
those of an earlier load under the same name.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections import defaultdict

import torch

from engine.errors import NinferError
from engine.layers.linear import Linear
from engine.lora.gguf_lora import read_gguf_adapter
from engine.lora.layer import LoraWeights
from engine.lora.peft import LoraPair, read_adapter
from engine.lora.spec import lora_modules
from engine.plan.runtime import device_memory
from engine.transfer import to_device

MIB = 1 << 20


class Adapters:
    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, device):
        self.model, self.dtype, self.device = model, dtype, torch.device(device)
        self.slots: dict[str, int] = {}
        self.paths: dict[str, str] = {}
        self.ranks: dict[str, int] = {}
        self._roots: dict[str, bytes] = {}
        self._next_slot = itertools.count()
        # slots 0 .. graph_lanes - 1 (the adapters loaded before the CUDA graphs were captured) are lanes of
        # the graphs: their steps replay graphs; an adapter loaded later runs its steps eagerly
        self.graph_lanes = 0
        self._nonce = os.urandom(16)

    @property
    def names(self) -> list[str]:
        return list(self.slots)

    @property
    def lane_count(self) -> int:
        """Lanes for CUDA graphs captured now: every loaded adapter's slot (slots are never reused; a slot
        with no pairs on a layer adds nothing there)."""
        return max(self.slots.values()) + 1 if self.slots else 0

    @property
    def num_bytes(self) -> int:
        return sum(layer.num_bytes for layer in self._layers())

    def require(self, name: str) -> None:
        if name not in self.slots:
            served = ", ".join(self.slots) or "none (serve --lora NAME=PATH)"
            raise NinferError(f"no LoRA adapter '{name}' is loaded; the adapters are: {served}")

    def require_mix(self, mix: tuple[tuple[str, float], ...]) -> None:
        for name, _ in mix:
            self.require(name)

    def users(self, name: str, requests) -> int:
        """How many of `requests` run with the adapter."""
        return sum(any(n == name for n, _ in r.sampling_params.adapter_mix) for r in requests)

    def read(self, name: str, path: str) -> list[LoraPair]:
        """The adapter's pairs, checked against the model (on the host; any thread may read)."""
        ((name, path),) = lora_modules({name: path})
        if path.endswith(".gguf"):
            return read_gguf_adapter(name, path, self.model)
        return read_adapter(name, path, self.model)

    def add(
        self, name: str, path: str, pairs: list[LoraPair] | None = None, pool_sized: bool = False
    ) -> None:
        """Put the adapter's pairs on its layers (read here unless given); requests may then name it. One
        that does not fit the device memory is refused in a sentence and leaves nothing on the layers;
        `pool_sized`: the KV pool has taken the memory the weights left (a load while serving)."""
        if name in self.slots:
            raise NinferError(
                f"a LoRA adapter named '{name}' is loaded already; unload it first, or pick a new name"
            )
        pairs = self.read(name, path) if pairs is None else pairs
        slot = next(self._next_slot)
        by_module = defaultdict(list)
        for pair in pairs:
            by_module[pair.module].append(pair)
        placed: list[Linear] = []
        try:
            for module_name, module_pairs in by_module.items():
                layer: Linear = self.model.get_submodule(module_name)
                if layer.lora is None:
                    layer.lora = LoraWeights(layer.out_features)
                placed.append(layer)
                layer.lora.add_adapter(slot, module_pairs, self.dtype, self.device)
        except torch.OutOfMemoryError:
            for layer in placed:  # as before the load: the slot's pairs gone, a layer's new LoraWeights too
                layer.lora.pairs.pop(slot, None)
                if not layer.lora.pairs:
                    layer.lora = None
            raise self._no_room(name, pairs, pool_sized) from None
        self.paths[name], self.ranks[name] = path, max(p.a.shape[0] for p in pairs)
        # this process's own (a prefix-cache file outlives it: another run's adapter of the same name and
        # slot may hold other weights)
        seed = f"lora:{slot}:{name}".encode() + self._nonce
        self._roots[name] = hashlib.blake2b(seed, digest_size=16).digest()
        self.slots[name] = slot  # last: only now can a request name it

    def _no_room(self, name: str, pairs: list[LoraPair], pool_sized: bool) -> NinferError:
        """The refusal of an adapter the device memory does not hold (its allocations given back)."""
        need = self.dtype.itemsize * sum(
            p.a.shape[0] * (p.a.shape[1] + self.model.get_submodule(p.module).out_features) for p in pairs
        )
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        free = device_memory(str(self.device))[1]
        way = (
            "the KV pool holds the rest: load it at start-up (serve --lora NAME=PATH sizes the pool after "
            "it) or leave more memory (--kv-capacity, --gpu-memory-utilization)"
            if pool_sized
            else "the weights hold the rest: an adapter of lower rank or a GPU with more memory"
        )
        return NinferError(
            f"LoRA adapter '{name}' takes {need / MIB:,.0f} MiB, more than the {free / MIB:,.0f} MiB free on "
            f"{self.device}: {way}"
        )

    def remove(self, name: str) -> None:
        """Take the adapter off its layers (no running or waiting request may use it)."""
        slot = self.slots.pop(name)
        del self.paths[name], self.ranks[name], self._roots[name]
        for layer in self._layers():
            if slot < self.graph_lanes and slot in layer.pairs:  # the graphs read it: zeros, kept alive
                for t in layer.pairs[slot]:
                    t.zero_()
            else:
                layer.pairs.pop(slot, None)

    def cache_root(self, mix: tuple[tuple[str, float], ...]) -> bytes:
        """The root of a request's prefix-cache hash chain: the base model's (empty), its adapter's, or one
        of its mix (`SamplingParams.adapter_mix`: each adapter's load and scale)."""
        if not mix:
            return b""
        if len(mix) == 1 and mix[0][1] == 1.0:
            return self._roots[mix[0][0]]
        parts = b"".join(self._roots[name] + float(scale).hex().encode() for name, scale in sorted(mix))
        return hashlib.blake2b(b"lora-mix:" + parts, digest_size=16).digest()

    def step_rows(
        self, scheduled, cu_seqlens: list[int]
    ) -> tuple[tuple[int, torch.Tensor | None, float], ...]:
        """(slot, rows [n] int64 on the device or None for every row, scale) of each adapter and scale in
        the step."""
        if not self.slots:
            return ()
        rows: dict[tuple[int, float], list[int]] = defaultdict(list)
        for i, r in enumerate(scheduled):
            for name, scale in r.sampling_params.adapter_mix:
                rows[self.slots[name], scale].extend(range(cu_seqlens[i], cu_seqlens[i + 1]))
        total = cu_seqlens[-1]
        return tuple(
            (slot, None if len(ids) == total else to_device(ids, torch.int64, self.device), scale)
            for (slot, scale), ids in rows.items()
        )

    def lane_scales(self, scheduled) -> list[list[tuple[int, float]]] | None:
        """(slot, scale) of each adapter each request runs with, for a CUDA graph's step; None when one of
        them is not a lane of the graphs (the step runs eagerly)."""
        lanes = [[(self.slots[n], scale) for n, scale in r.sampling_params.adapter_mix] for r in scheduled]
        return None if any(slot >= self.graph_lanes for row in lanes for slot, _ in row) else lanes

    def _layers(self):
        return (m.lora for m in self.model.modules() if isinstance(m, Linear) and m.lora is not None)
