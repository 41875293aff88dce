import torch

# The gathered cos/sin of the last positions: every layer of a step rotates at the same positions, so
# the gather is done once per step (keyed on a copy of the positions' values, so a tensor updated in
# place is never served stale).
_last: tuple | None = None


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype):
    """cos2 = [cos | cos], sin2 = [-sin | sin]: [T, 1, R] each, in `dtype`."""
    global _last
    if _last is not None:
        pos, cache, dt = _last[0]
        if cache is cos_sin_cache and dt == dtype and torch.equal(pos, positions):
            return _last[1]
    cos, sin = cos_sin_cache[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2] each
    tables = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
    _last = ((positions.clone(), cos_sin_cache, dtype), tables)
    return tables


def rope(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hk, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_pos, R] fp32: cos | sin of each position's R/2 frequencies
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, NeoX (rotate-half) layout, on the first R dims of each head (R <= D).

    With x = [x1 | x2] (halves of the rotated dims): out = [x1 cos - x2 sin | x2 cos + x1 sin]
    = x * [cos | cos] + [x2 | x1] * [-sin | sin].
    """
    cos2, sin2 = _cos_sin(positions, cos_sin_cache, q.dtype)
    rot = cos2.shape[-1]
    half = rot // 2
    x = torch.cat([q, k], dim=1)  # [T, Hq + Hk, D]: both rotated at once
    swapped = torch.cat([x[..., half:rot], x[..., :half]], dim=-1).mul_(sin2)  # [T, H, R]
    rotated = torch.addcmul(swapped, x[..., :rot], cos2)
    if rot < x.shape[-1]:  # partial rotary: the other dims pass through
        rotated = torch.cat([rotated, x[..., rot:]], dim=-1)
    return rotated.split([q.shape[1], k.shape[1]], dim=1)
