import torch


def dequantize_weight(
    packed: torch.Tensor,  # uint8 [N, Kp / 2] (4-bit, even column in the low nibble) or int8 [N, Kp] (8-bit)
    scales: torch.Tensor,  # fp16 [N, Kp / group_size]
    minimums: torch.Tensor | None,  # fp16 [N, Kp / group_size] (4-bit: w = q * scale + minimum)
    bits: int,
    group_size: int,
    k: int,
) -> torch.Tensor:
    """The fp32 weight [N, K] of a group-wise quantized matrix (engine/quant/groupwise.py's layout)."""
    if bits == 8:
        codes = packed.float()
    else:
        p = packed.to(torch.int32)
        codes = torch.stack([p & 0xF, p >> 4], dim=-1).flatten(1).float()
    n = codes.shape[0]
    w = codes.view(n, -1, group_size) * scales.float()[..., None]
    if minimums is not None:
        w = w + minimums.float()[..., None]
    return w.reshape(n, -1)[:, :k]


def quant_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scales: torch.Tensor,
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
) -> torch.Tensor:
    """y = x W^T for a 4- or 8-bit group-wise quantized W [N, K]: [M, N] in x's dtype, fp32 accumulation."""
    w = dequantize_weight(packed, scales, minimums, bits, group_size, x.shape[1])
    return (x.float() @ w.t()).to(x.dtype)
