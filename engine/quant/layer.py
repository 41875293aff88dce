"""A linear weight kept group-wise quantized in memory, multiplied by the fused dequant matmul kernel."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import ninfer_kernels as kernels
from engine.layers.linear import Linear
from engine.quant.fp4_layer import Fp4Weight
from engine.quant.groupwise import QuantizedTensor
from engine.worker.forward_context import current_forward_context
from ninfer_kernels.int8_matmul import MIN_GROUP as INT8_MIN_GROUP
from ninfer_kernels.quant_matmul import GEMV_MAX_M, MIN_GROUP

# rows of x from which --int8-prefill multiplies int8 activations (kernels/int8_matmul) in a prompt step; up
# to GEMV_MAX_M rows the weight-streaming GEMV keeps 16-bit activations: it is bandwidth-bound
INT8_MIN_ROWS = GEMV_MAX_M + 1

QuantizedActivations = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # kernels.quantize_act's result


@dataclass
class GroupwiseWeight:
    bits: int
    group_size: int
    k: int
    packed: torch.Tensor  # [N, Kp / 2] uint8 (4-bit), [N, 3 Kp / 4] uint8 (6-bit) or [N, Kp] int8 (8-bit)
    scales: torch.Tensor  # [N, G] fp16
    minimums: torch.Tensor | None  # [N, G] fp16 (4 / 6-bit)
    # --int8-prefill: from this many rows of x on, x is quantized to int8 per (token, group) and multiplied
    # on the int8 tensor cores (kernels/int8_matmul); 0 = always 16-bit activations
    int8_min_rows: int = 0
    # int32 [K]: the input column each stored column holds (an act-order checkpoint's groups gathered;
    # QuantizedTensor.columns): the kernels load x's columns in this order (the int8 path gathers them
    # first, `gathered`). None: in order
    columns: torch.Tensor | None = None

    @staticmethod
    def from_shards(shards: list[QuantizedTensor], device: torch.device | str) -> GroupwiseWeight:
        """One weight from checkpoint tensors fused along the output dim (q|k|v, gate|up): rows concatenated."""
        first = shards[0]
        assert all(same_layout(s, first) for s in shards)

        def cat(ts):
            return torch.cat(ts, dim=0).to(device).contiguous()

        return GroupwiseWeight(
            bits=first.bits,
            group_size=first.group_size,
            k=first.shape[1],
            packed=cat([s.packed for s in shards]),
            scales=cat([s.scales for s in shards]),
            minimums=cat([s.minimums for s in shards]) if first.minimums is not None else None,
            columns=None if first.columns is None else first.columns.to(device),
        )

    @property
    def out_features(self) -> int:
        return self.scales.shape[0]

    def first_rows(self, n: int) -> GroupwiseWeight:
        """The first `n` output rows, as views of the same packed storage."""
        rows = (self.packed[:n], self.scales[:n], None if self.minimums is None else self.minimums[:n])
        return replace(self, packed=rows[0], scales=rows[1], minimums=rows[2])

    @property
    def nbytes(self) -> int:
        tensors = [self.packed, self.scales, self.minimums, self.columns]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def takes_int8(self, x: torch.Tensor) -> bool:
        """--int8-prefill: x has INT8_MIN_ROWS+ rows inside a step that carries a prompt chunk (decode and
        draft verification keep 16-bit activations even with many rows, so drafts verify exactly as
        plain decoding computes; so does the head over a step's sampled rows, run outside the forward)."""
        if not 0 < self.int8_min_rows <= x.shape[0]:
            return False
        ctx = current_forward_context()
        return ctx is not None and ctx.int8_activations

    def __call__(
        self, x: torch.Tensor, out: torch.Tensor | None = None, xq: QuantizedActivations | None = None
    ) -> torch.Tensor:
        # x: [M, K] -> [M, N] (into out, a view of a wider output's columns, where given); xq: x (gathered)
        # quantized for this weight's group size already (a fused projection's parts share it)
        args = (self.packed, self.scales, self.minimums, self.bits, self.group_size)
        if not self.takes_int8(x):  # (an act-order weight's column order: x gathered as the kernels load it)
            return kernels.quant_matmul(x, *args, out, columns=self.columns)
        xq = xq or kernels.quantize_act(self.gathered(x), self.group_size)
        return kernels.int8_matmul(
            *xq, *args, x.new_empty((x.shape[0], self.out_features)) if out is None else out
        )

    def gathered(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] with its columns in the stored order (x itself where that is the input's)."""
        return x if self.columns is None else x.index_select(1, self.columns)

    def lookup(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of the matrix as an embedding table ([T] -> [T, K] in dtype), dequantized on lookup."""
        assert self.columns is None, "an embedding table is stored with its columns in order"
        args = (self.packed, self.scales, self.minimums, self.bits, self.group_size, self.k, dtype)
        return kernels.quant_embedding(ids, *args)


@dataclass
class ConcatenatedWeights:
    """A fused projection (q|k|v, gate|up) whose checkpoint shards were quantized at different widths or
    groups (q4.6 chooses per tensor), or act-order column orders: one GroupwiseWeight per run of shards of
    one layout (same_layout), a kernel call each, writing its own columns of the output. An FP4
    checkpoint's: an Fp4Weight per run of FP4 shards, a DenseRows per run of 16-bit ones
    (engine/quant/fp4_layer.py)."""

    parts: list  # GroupwiseWeight, Fp4Weight, DenseRows

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, sum of the parts' N]: each part's kernel writes its own columns (no concatenation)
        out = x.new_empty((x.shape[0], sum(p.out_features for p in self.parts)))
        # --int8-prefill: x's codes once per group size and column order
        quantized: dict[tuple[int, int | None], QuantizedActivations] = {}
        start = 0
        for part in self.parts:
            xq = None
            if part.takes_int8(x):
                key = (part.group_size, None if part.columns is None else id(part.columns))
                if key not in quantized:
                    quantized[key] = kernels.quantize_act(part.gathered(x), part.group_size)
                xq = quantized[key]
            part(x, out[:, start : start + part.out_features], xq)
            start += part.out_features
        return out


def packed_weight(shards: list[QuantizedTensor], device) -> GroupwiseWeight | ConcatenatedWeights:
    """The packed weight of a (fused) parameter from its shards in output order: one GroupwiseWeight where
    every shard has the same width, group and column order, else one per run of equal ones."""
    runs: list[list[QuantizedTensor]] = []
    for shard in shards:
        if runs and same_layout(runs[-1][0], shard):
            runs[-1].append(shard)
        else:
            runs.append([shard])
    parts = [GroupwiseWeight.from_shards(run, device) for run in runs]
    return parts[0] if len(parts) == 1 else ConcatenatedWeights(parts)


def same_layout(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Whether two shards concatenate into one packed weight: one width, group, K and column order."""
    if (a.bits, a.group_size, a.shape[1]) != (b.bits, b.group_size, b.shape[1]):
        return False
    if a.columns is None or b.columns is None:
        return a.columns is None and b.columns is None
    return a.columns is b.columns or torch.equal(a.columns, b.columns)


def fused_kernel_takes(bits: int, group_size: int) -> bool:
    """Whether kernels/quant_matmul multiplies this width and group directly (else it is dequantized at load)."""
    return group_size >= MIN_GROUP.get(bits, 1 << 30)


def packed_weights(model: torch.nn.Module, kinds: tuple[type, ...] = (GroupwiseWeight,)) -> list:
    """Every packed weight of `kinds` the linear layers of `model` multiply (each once, a fused one's parts
    apart): integer groups by default."""
    found: dict[int, object] = {}
    for m in model.modules():
        weight = getattr(m, "qweight", None) if isinstance(m, Linear) else None
        for part in weight.parts if isinstance(weight, ConcatenatedWeights) else [weight]:
            if isinstance(part, kinds):
                found[id(part)] = part
    return list(found.values())


def int8_kernel_takes(bits: int, group_size: int) -> bool:
    """Whether --int8-prefill multiplies this width and group with int8 activations: kept packed, in groups
    of kernels/int8_matmul's MIN_GROUP or more (others keep 16-bit activations)."""
    return fused_kernel_takes(bits, group_size) and group_size >= INT8_MIN_GROUP


def use_int8_activations(model: torch.nn.Module) -> int:
    """--int8-prefill: the packed weights multiply int8 activations from INT8_MIN_ROWS rows of x on, where
    int8_kernel_takes them. Returns how many weights do."""
    count = 0
    for weight in packed_weights(model):
        if int8_kernel_takes(weight.bits, weight.group_size):
            weight.int8_min_rows = INT8_MIN_ROWS
            count += 1
    return count


def holds_packed_weights(model: torch.nn.Module) -> bool:
    """Whether a linear layer of `model` multiplies a packed weight, integer groups or FP4 (long prefill
    chunks then dequantize slices into kernels/quant_matmul's scratch: a row of the memory ledger)."""
    return bool(packed_weights(model, (GroupwiseWeight, Fp4Weight)))
