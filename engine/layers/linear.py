"""Dense linear layers whose parameters know how to load (and fuse) checkpoint tensors."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from engine.layers.module import Module


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
    assert shard_id is None, f"unexpected shard {shard_id} for an unfused parameter"
    if param.shape != loaded.shape:
        raise ValueError(
            f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}"
        )
    param.data.copy_(loaded)


_MATRICES_ON_META = False


@contextmanager
def matrices_on_meta():
    """Build a model whose matrices (parameters of 2+ dimensions) take no memory until `materialize`: a
    quantized model the GPU keeps packed never holds its dense matrices, not even between construction
    and loading (a 27B model's would need 54 GB in bf16)."""
    global _MATRICES_ON_META
    prev, _MATRICES_ON_META = _MATRICES_ON_META, True
    try:
        yield
    finally:
        _MATRICES_ON_META = prev


def materialize(param: nn.Parameter, device: torch.device | str) -> None:
    """Give a parameter built under matrices_on_meta its (uninitialised) storage on `device`."""
    if param.is_meta:  # (`.data =` cannot leave the meta device; a swap keeps the object and its attributes)
        attributes = dict(param.__dict__)  # weight_loader, shard_names
        torch.utils.swap_tensors(
            param,
            nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device), requires_grad=False),
        )
        param.__dict__.update(attributes)


def make_param(*shape: int, loader=default_weight_loader, shards: dict | None = None) -> nn.Parameter:
    device = "meta" if _MATRICES_ON_META and len(shape) >= 2 else None  # None: the current default device
    p = nn.Parameter(torch.empty(*shape, device=device), requires_grad=False)
    p.weight_loader = loader
    # NOTE: the shard names a fused parameter expects; the loader checks every one arrived
    p.shard_names = tuple(shards) if shards else ()
    return p


class Linear(Module):
    """y = x W^T (+ b). W: [out, in]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = make_param(out_features, in_features)
        self.bias = make_param(out_features) if bias else None
        # a weight-only quantized copy (engine/quant/cpu.py) that replaces `weight` once set
        self.qweight = None
        # LoRA adapters' low-rank pairs (engine/lora/layer.py), added for the rows that run them
        self.lora = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweight is None:
            y = nn.functional.linear(x, self.weight, self.bias)
        else:
            y = self.qweight(x)
            y = y if self.bias is None else y + self.bias
        return y if self.lora is None else self.lora(x, y)

    def first_rows(self, n: int) -> Linear:
        """A Linear over this one's first `n` outputs, sharing its storage (a dense weight's rows, or a
        packed GPU weight's rows: engine/quant/layer.GroupwiseWeight.first_rows)."""
        head = Linear.__new__(Linear)
        Module.__init__(head)
        head.in_features, head.out_features = self.in_features, n
        head.weight = None if self.weight is None else nn.Parameter(self.weight.data[:n], requires_grad=False)
        head.bias = None if self.bias is None else nn.Parameter(self.bias.data[:n], requires_grad=False)
        head.qweight = None if self.qweight is None else self.qweight.first_rows(n)
        head.lora = None
        return head


class MergedLinear(Linear):
    """Several checkpoint projections of the same input fused along the output dimension.

    `shards` maps a shard name (e.g. "q", "k", "v") to its output size, in order.
    """

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool = False):
        super().__init__(in_features, sum(shards.values()), bias)
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shards.items():
            self.offsets[name] = (start, size)
            start += size
        for p in (self.weight, self.bias):
            if p is not None:
                p.weight_loader = self._load_shard
                p.shard_names = tuple(shards)

    def _load_shard(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        assert shard_id in self.offsets, f"unknown shard {shard_id}"
        start, size = self.offsets[shard_id]
        target = param.data.narrow(0, start, size)
        if target.shape != loaded.shape:
            raise ValueError(
                f"shape mismatch for shard {shard_id}: parameter {tuple(target.shape)} vs checkpoint "
                f"{tuple(loaded.shape)}"
            )
        target.copy_(loaded)

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return y.split([size for _, size in self.offsets.values()], dim=-1)


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.weight = make_param(num_embeddings, embedding_dim)
        # a packed table (engine/quant/layer.GroupwiseWeight, a .ninfer on CUDA) that replaces `weight` once
        # set: rows are dequantized on lookup, to the dtype the dense table had
        self.qweight = None
        self.dtype = self.weight.dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.qweight is not None:
            return self.qweight.lookup(input_ids, self.dtype)
        return nn.functional.embedding(input_ids, self.weight)


def store_weights_column_major(model: nn.Module) -> None:
    """CPU only: re-lay each linear weight [out, in] with `in` as the fast axis of its storage.

    The shape and the math stay the same; the CPU BLAS then streams W^T contiguously in the decode GEMV
    (measured 1.5x faster at M = 1 once the weights no longer fit the cache, the same speed for prefill).
    """
    for module in model.modules():
        if isinstance(module, Linear) and module.weight is not None:
            module.weight.data = module.weight.data.t().contiguous().t()
