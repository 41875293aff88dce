import torch

from ninfer_kernels.int8_act.naive import dequantize_act
from ninfer_kernels.quant_matmul.naive import dequantize_weight


def int8_matmul(
    codes: torch.Tensor,  # int8 [M, Kp]: x's codes per (row, group of group_size columns), kernels/int8_act
    x_scales: torch.Tensor,  # fp32 [M, G]
    x_sums: torch.Tensor,  # int32 [M, G]: the codes' sum per (row, group)
    packed: torch.Tensor,  # a group-wise quantized W [N, Kp] (kernels/quant_matmul/naive.py's layouts)
    scales: torch.Tensor,  # fp16 [N, G]
    minimums: torch.Tensor | None,  # fp16 [N, G] (4 / 6-bit)
    bits: int,
    group_size: int,
    out: torch.Tensor,  # [M, N], the output dtype, unit column stride
) -> torch.Tensor:
    """out = dequant(codes, x_scales) @ dequant(W)^T with fp32 accumulation; returns out. x_sums is what the
    kernel adds the minimums' share with (sum_k x_k min = min * scale_x * sum_k codes_k); the twin
    recomputes it from the codes."""
    del x_sums
    x = dequantize_act(codes, x_scales)
    w = dequantize_weight(packed, scales, minimums, bits, group_size, codes.shape[1])
    return out.copy_(x @ w.t())
