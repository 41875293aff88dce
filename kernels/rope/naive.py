import torch

from ninfer_kernels.step_memo import StepMemo

# every layer of a step rotates at the same positions: the cos/sin gather is done once per step
_COS_SIN = StepMemo()
_ROTATIONS = StepMemo()
# up to this many tokens (decode, speculative verification) each token's rotation is applied as one
# [D, D] matrix: two batched matmuls instead of ~8 slicing and elementwise calls, which a decode step of
# small rows pays in every layer
MATRIX_MAX_TOKENS = 16


def _rotations(positions: torch.Tensor, cos_sin_cache: torch.Tensor, head_dim: int, dtype: torch.dtype):
    """[T, D, D]: x @ R[t] rotates x [.., D] at positions[t] (NeoX pairs (i, i + R/2); dims >= R pass)."""

    def build():
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [T, R/2] fp32 each
        half = cos.shape[-1]
        r = torch.eye(head_dim, dtype=torch.float32, device=positions.device).repeat(len(positions), 1, 1)
        i = torch.arange(half, device=positions.device)
        # out[i] = x[i] cos - x[i+h] sin, out[i+h] = x[i+h] cos + x[i] sin; R[src, dst]
        r[:, i, i], r[:, i + half, i + half] = cos, cos
        r[:, i + half, i], r[:, i, i + half] = -sin, sin
        return r.to(dtype)

    return _ROTATIONS.get((positions,), (cos_sin_cache, head_dim, dtype), build)


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype):
    """cos2 = [cos | cos], sin2 = [-sin | sin]: [T, 1, R] each, in `dtype`."""

    def gather():
        cos, sin = cos_sin_cache[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2] each
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

    return _COS_SIN.get((positions,), (cos_sin_cache, dtype), gather)


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
    if q.shape[0] <= MATRIX_MAX_TOKENS:
        r = _rotations(positions, cos_sin_cache, q.shape[-1], q.dtype)  # [T, D, D]
        return torch.matmul(q, r), torch.matmul(k, r)
    cos2, sin2 = _cos_sin(positions, cos_sin_cache, q.dtype)
    rot = cos2.shape[-1]
    half = rot // 2
    x = torch.cat([q, k], dim=1)  # [T, Hq + Hk, D]: both rotated at once
    swapped = torch.cat([x[..., half:rot], x[..., :half]], dim=-1).mul_(sin2)  # [T, H, R]
    rotated = torch.addcmul(swapped, x[..., :rot], cos2)
    if rot < x.shape[-1]:  # partial rotary: the other dims pass through
        rotated = torch.cat([rotated, x[..., rot:]], dim=-1)
    return rotated.split([q.shape[1], k.shape[1]], dim=1)
