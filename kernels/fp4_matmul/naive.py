import torch

# e2m1's magnitudes by a code's bits 0-2; bit 3 is the sign
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def group_scales(scale_codes: torch.Tensor, e8m0: bool) -> torch.Tensor:
    """uint8 scale codes [N, G] -> fp32 [N, G]: e4m3 bits, or e8m0 exponents 2^(s - 127) (s = 0: 0)."""
    if e8m0:
        s = scale_codes.float()
        return torch.where(s == 0, torch.zeros_like(s), torch.exp2(s - 127))
    return scale_codes.view(torch.float8_e4m3fn).float()


def dequantize_weight(
    packed: torch.Tensor,  # uint8 [N, K / 2]: e2m1 codes, even column in the low nibble
    scale_codes: torch.Tensor,  # uint8 [N, ceil(K / group_size)]: e4m3 bits or e8m0 exponents
    multiplier: torch.Tensor,  # fp32 [N]: the tensor scale of each row
    group_size: int,
    e8m0: bool,
    k: int,
) -> torch.Tensor:
    """The fp32 weight [N, K] of an FP4 matrix (kernels/fp4_matmul's layout)."""
    n = packed.shape[0]
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(1).long()  # [N, 2 * K / 2]
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1), device=packed.device)
    values = table[codes]
    groups = scale_codes.shape[1]
    values = torch.nn.functional.pad(values, (0, groups * group_size - values.shape[1]))
    scales = group_scales(scale_codes, e8m0) * multiplier.float()[:, None]  # [N, G]
    w = values.view(n, groups, group_size) * scales[..., None]
    return w.reshape(n, -1)[:, :k]


def fp4_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scale_codes: torch.Tensor,
    multiplier: torch.Tensor,
    group_size: int,
    e8m0: bool,
    out: torch.Tensor | None = None,  # [M, N] in x's dtype, unit column stride
) -> torch.Tensor:
    """y = x W^T for an FP4 matrix W [N, K] (kernels/fp4_matmul's layout): [M, N] in x's dtype, fp32
    accumulation; written into `out` (a column view of a wider output, say) where given."""
    w = dequantize_weight(packed, scale_codes, multiplier, group_size, e8m0, x.shape[1])
    y = (x.float() @ w.t()).to(x.dtype)
    return y if out is None else out.copy_(y)
