"""`--weight-quant int8 / int4` where the fused kernels multiply packed weights (a GPU): a 16-bit checkpoint's
matrices (or an FP8 one's, dequantized as they stream) quantized as they load into ninfer's 8- / 4-bit groups
of 128 and held packed, as `ninfer convert --recipe w8g128 / w4g128 --method rtn` would store them (round
to nearest with the clipping search; the same matrices: engine/quant/recipes.is_quantizable), without the
file. The rounding runs on the device a slice of rows at a time, so its fp32 work buffers stay small beside
the weights already loaded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch

from engine.errors import NinferError
from engine.formats.source import ModelSource, WeightIterator
from engine.formats.stacked_experts import per_expert
from engine.quant.groupwise import QuantizedTensor, quantize
from engine.quant.recipes import GROUP_SIZE, is_quantizable

BITS = {"int8": 8, "int4": 4}
SLICE_BYTES = 1 << 26  # the fp32 bytes of a slice of rows rounded at once (a few such buffers live at once)


def quantizing_on_load(source: ModelSource, mode: str, device: str) -> ModelSource:
    """`source` with its quantizable matrices quantized to BITS[mode] as they stream (quantized_weights, on
    `device`) and the other tensors as stored (unquantized_weights)."""
    if source.quantized_weights is not None:
        raise NinferError(
            f"--weight-quant {mode} quantizes a 16-bit checkpoint as it loads, but {source.description} is "
            "quantized already (its weights are held as stored); drop --weight-quant"
        )
    bits = BITS[mode]
    rest: deque[tuple[str, torch.Tensor]] = deque()  # the pass's tensors left as stored, for the second
    tensor_bits: dict[str, int] = {}
    state = {"passed": False}

    def quantized() -> Iterator[tuple[str, QuantizedTensor]]:
        rest.clear()
        for name, tensor in per_expert(source.weights()):
            if is_quantizable(name, tensor.shape):
                tensor_bits[name] = bits
                yield name, quantize_rows(tensor, bits, device)
            else:
                rest.append((name, tensor))
        state["passed"] = True

    def unquantized() -> WeightIterator:
        if not state["passed"]:  # (not after the quantized pass: read them)
            yield from (t for t in per_expert(source.weights()) if not is_quantizable(t[0], t[1].shape))
            return
        while rest:
            yield rest.popleft()

    return ModelSource(
        source.config,
        source.tokenizer,
        source.weights,
        f"{source.description}, quantized at load to {bits}-bit groups of {GROUP_SIZE}",
        tensor_bits,
        quantized_weights=quantized,
        unquantized_weights=unquantized,
    )


def quantize_rows(w: torch.Tensor, bits: int, device: str | torch.device) -> QuantizedTensor:
    """W [N, K] quantized (groupwise.quantize) on `device`, SLICE_BYTES of fp32 rows at a time."""
    n, k = w.shape
    step = max(1, SLICE_BYTES // (4 * k))
    parts = [quantize(w[i : i + step].to(device), bits, GROUP_SIZE) for i in range(0, n, step)]
    first = parts[0]
    return QuantizedTensor(
        bits=bits,
        group_size=first.group_size,
        shape=(n, k),
        packed=torch.cat([p.packed for p in parts]),
        scales=torch.cat([p.scales for p in parts]),
        minimums=None if first.minimums is None else torch.cat([p.minimums for p in parts]),
    )
