import torch


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Packed storage -> codes [N, Kp] int32 (8-bit: the signed values). 4-bit: two a byte, even column in
    the low nibble; 6-bit: four a little-endian 24-bit word, first in the low bits; 8-bit: int8."""
    p = packed.to(torch.int32)
    if bits == 8:
        return p
    if bits == 4:
        return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(1)
    b = p.reshape(p.shape[0], -1, 3)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    return torch.stack([(word >> s) & 0x3F for s in (0, 6, 12, 18)], dim=-1).flatten(1)


def dequantize_weight(
    packed: torch.Tensor,  # uint8 [N, Kp / 2] (4-bit, even column in the low nibble), uint8 [N, 3 Kp / 4]
    # (6-bit: four codes a little-endian 24-bit word, first in the low bits) or int8 [N, Kp] (8-bit)
    scales: torch.Tensor,  # fp16 [N, Kp / group_size]
    minimums: torch.Tensor | None,  # fp16 [N, Kp / group_size] (4 / 6-bit: w = q * scale + minimum)
    bits: int,
    group_size: int,
    k: int,
    columns: torch.Tensor | None = None,  # int32 [K]: the input column each stored column holds (act-order)
) -> torch.Tensor:
    """The fp32 weight [N, K] of a group-wise quantized matrix (engine/quant/groupwise.py's layout), its
    columns in the input's order (`columns`: an act-order matrix's stored order, put back)."""
    codes = unpack(packed, bits).float()
    n = codes.shape[0]
    w = codes.view(n, -1, group_size) * scales.float()[..., None]
    if minimums is not None:
        w = w + minimums.float()[..., None]
    w = w.reshape(n, -1)[:, :k]
    return w if columns is None else torch.empty_like(w).index_copy_(1, columns.long(), w)


def quant_matmul(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,
    scales: torch.Tensor,
    minimums: torch.Tensor | None,
    bits: int,
    group_size: int,
    out: torch.Tensor | None = None,  # [M, N] in x's dtype, unit column stride
    columns: torch.Tensor | None = None,  # int32 [K]: the input column each stored column holds
) -> torch.Tensor:
    """y = x W^T for a 4-, 6- or 8-bit group-wise quantized W [N, K]: [M, N] in x's dtype, fp32 accumulation.
    With `out` (a column view of a wider output, say), y is written there and out returned. With `columns`
    (an act-order checkpoint's groups gathered from scattered input columns), W's column j multiplies x's
    column columns[j]: y = x[:, columns] W^T."""
    if columns is not None:
        x = x.index_select(1, columns)
    w = dequantize_weight(packed, scales, minimums, bits, group_size, x.shape[1])
    y = (x.float() @ w.t()).to(x.dtype)
    return y if out is None else out.copy_(y)
