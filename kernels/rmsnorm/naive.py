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
    if x.dtype == torch.float32 and not zero_centered:  # one fused op, the same math
        out = torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.float(), eps)
        return out if residual is None else (out, residual)
    xf = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    if zero_centered:
        out = (xf * (1.0 + weight.float())).to(x.dtype)
    else:
        out = weight * xf.to(x.dtype)
    return out if residual is None else (out, residual)


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
