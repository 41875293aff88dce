import torch


def rope(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hk, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, R] fp32: cos | sin of each position's R/2 frequencies
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, NeoX (rotate-half) layout, on the first R dims of each head (R <= D)."""
    cos, sin = cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2] each
    half = cos.shape[-1]
    x = torch.cat([q, k], dim=1)  # [T, Hq + Hk, D]: both rotated at once
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    x = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)
    return x.split([q.shape[1], k.shape[1]], dim=1)
