import torch


def rmsnorm(
    x: torch.Tensor,  # [T, D]
    weight: torch.Tensor,  # [D]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, D]
    zero_centered: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm in fp32, cast back to x's dtype.

    With `residual`, adds it first and returns (normed, new_residual) where new_residual = x + residual.
    `zero_centered` scales by (1 + weight) (Qwen3.5) instead of weight (Llama, Qwen3).
    """
    if residual is not None:
        x = x + residual
        residual = x
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        out = _rms_norm_fp32(x, 1.0 + weight if zero_centered else weight, eps)
        return out if residual is None else (out, residual)
    xf = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    if zero_centered:
        out = (xf * (1.0 + weight.float())).to(x.dtype)
    else:
        out = weight * xf.to(x.dtype)
    return out if residual is None else (out, residual)


_EPS: dict[tuple[float, torch.device], torch.Tensor] = {}


def _rms_norm_fp32(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * scale in five torch calls (torch's own rms_norm makes ~13 on the CPU,
    which a decode step of small rows pays ~60 times)."""
    eps_t = _EPS.get((eps, x.device))
    if eps_t is None:
        eps_t = _EPS[(eps, x.device)] = torch.tensor(eps, dtype=torch.float32, device=x.device)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # [..., 1]
    inv_rms = torch.rsqrt(torch.addcmul(eps_t, norm, norm, value=1.0 / x.shape[-1]))
    return torch.mul(x, inv_rms).mul_(scale)


def rmsnorm_gated(
    x: torch.Tensor,  # [T, H, D]
    gate: torch.Tensor,  # [T, H, D]
    weight: torch.Tensor,  # [D]
    eps: float,
) -> torch.Tensor:
    """Gated RMSNorm of the Gated DeltaNet output: weight * rms_norm(x) * silu(gate)."""
    xf = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    out = weight * xf.to(x.dtype)
    return (out * torch.nn.functional.silu(gate.float())).to(x.dtype)
