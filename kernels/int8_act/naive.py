import torch

from ninfer_kernels.int8_act import QMAX


def quantize_act(
    x: torch.Tensor,  # [M, K] any float dtype
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x -> (codes int8 [M, Kp], scales fp32 [M, G], sums int32 [M, G]), Kp = G * group_size, G =
    ceil(K / group_size). Each (row, group): scale = max |x| / QMAX, codes = floor(x * (QMAX / max |x|) +
    0.5) (an all-zero group: scale 0, codes 0), sums = the codes' sum; x ~= codes * scale. The columns past
    K are zero codes."""
    m, k = x.shape
    groups = -(-k // group_size)
    xg = torch.nn.functional.pad(x.float(), (0, groups * group_size - k)).view(m, groups, group_size)
    amax = xg.abs().amax(dim=-1)  # [M, G]
    inv = torch.where(amax > 0, QMAX / amax, torch.zeros_like(amax))
    codes = torch.floor(xg * inv[..., None] + 0.5).clamp(-QMAX, QMAX)
    scales = amax / QMAX
    return codes.to(torch.int8).view(m, -1), scales, codes.sum(dim=-1).to(torch.int32)


def dequantize_act(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(codes [M, Kp], scales [M, G]) -> fp32 [M, Kp]."""
    m, groups = scales.shape
    return (codes.float().view(m, groups, -1) * scales[..., None]).view(m, -1)
