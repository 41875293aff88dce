import torch

from ninfer_kernels.quant_matmul.naive import dequantize_weight


def quant_embedding(
    ids: torch.Tensor,  # [T] int64
    packed: torch.Tensor,  # a group-wise quantized table [V, D] (kernels/quant_matmul/naive.py's layouts)
    scales: torch.Tensor,  # fp16 [V, Dp / group_size]
    minimums: torch.Tensor | None,  # fp16 [V, Dp / group_size] (4 / 6-bit)
    bits: int,
    group_size: int,
    dim: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The rows `ids` of the table, dequantized: [T, D] in `dtype`."""
    mins = minimums[ids] if minimums is not None else None
    return dequantize_weight(packed[ids], scales[ids], mins, bits, group_size, dim).to(dtype)
