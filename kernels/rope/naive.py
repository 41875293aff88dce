import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos/sin: [T, 1, R/2]; NeoX layout: the rotated pairs are (i, i + R/2) in the first R dims
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    cos2 = torch.cat([cos, cos], dim=-1)
    sin2 = torch.cat([sin, sin], dim=-1)
    rotated = x_rot * cos2 + torch.cat([-x2, x1], dim=-1) * sin2
    return torch.cat([rotated, x_pass], dim=-1)


def rope(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hk, D]
    positions: torch.Tensor,  # [T] int64
    inv_freq: torch.Tensor,  # [R/2] fp32; R = rotary dims (partial rotary when R < D)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, NeoX (rotate-half) layout, on the first R dims of each head."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, R/2]
    cos = freqs.cos().to(q.dtype)[:, None, :]
    sin = freqs.sin().to(q.dtype)[:, None, :]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
