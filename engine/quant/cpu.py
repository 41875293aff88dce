"""Weight-only int8 / int4 linear weights for the CPU, on torch's packed CPU matmul kernels.

Decode on a CPU is bound by reading weights, so fewer bytes per weight is the lever: int4 reads an
eighth of fp32. The kernels take bf16 activations (their fp32 path is a slow fallback), so a
quantized layer runs x -> bf16 -> matmul -> back to x's dtype.

* int4: groups of INT4_GROUP input columns, asymmetric: w = (q - 8) * scale + zero, q in [0, 15]. A GGUF
  Q4_0 / Q4_1 block (32 weights, w = q * d + m) is exactly such a group, so a 4-bit GGUF keeps its
  weights (the scales are rounded to bf16).
* int8: per output channel, symmetric: w = q * scale, q in [-127, 127].
"""

from __future__ import annotations

import torch

INT4_GROUP = 32
# from this many rows on (prefill), an int4 layer unpacks its weight to bf16 and runs the bf16 GEMM: on
# this CPU class that is ~2.5x faster than the int4 kernel at M = 2048, and the unpack is cheap beside it
DENSE_MIN_ROWS = 64
MODES = ("none", "int8", "int4")


class CpuInt8Weight:
    """int8 weights times int8 activations quantized per token on the fly: the int8 dot products run on the
    CPU's integer units (VNNI), faster than any float path here. Each activation row goes in as two int8
    rows, x ~ q1 s1 + q2 s2 (q2 quantizes what q1 left over), in the same matmul: ~15-bit activations for
    the price of one weight read, where a single int8 row moved a head's logprobs by ~0.2."""

    def __init__(self, w: torch.Tensor):
        # w: [N, K]
        w = w.float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [N]
        qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()  # [N, K]
        self.qweight_t = qweight.t()  # [K, N] view: the GEMV then streams each output's K weights
        self.scales = scales
        self.shape = tuple(w.shape)

    @property
    def nbytes(self) -> int:
        return self.qweight_t.numel() + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        return self.qweight_t.t().float() * self.scales[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, N]
        m = x.shape[0]
        xf = x.float()
        s1 = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # [M, 1]
        q1 = torch.round(xf / s1)
        rest = xf - q1 * s1
        s2 = rest.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        q2 = torch.round(rest / s2)
        y = torch._int_mm(torch.cat([q1, q2]).to(torch.int8), self.qweight_t).float()  # [2M, N]
        return ((y[:m] * s1 + y[m:] * s2) * self.scales).to(x.dtype)


class CpuInt4Weight:
    def __init__(self, w: torch.Tensor):
        # w: [N, K], K a multiple of INT4_GROUP
        n, k = w.shape
        g = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [N, K / G]
        scale = ((hi - lo) / 15.0).clamp(min=1e-12)
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = lo + 8.0 * scale
        self.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # the same codes, two per byte (even column in the low nibble), for the prefill path
        self.codes = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # [N, K / 2]
        # [K / G, N, 2]: (scale, zero) per group, as the kernel wants them
        self.scales_and_zeros = (
            torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        )
        self.shape = (n, k)

    @property
    def nbytes(self) -> int:
        """Bytes a decode step reads (the int4 kernel's packing and the group scales)."""
        return self.qweight.numel() * self.qweight.element_size() + self.scales_and_zeros.numel() * 2

    def dequantize(self) -> torch.Tensor:
        eye = torch.eye(self.shape[1], dtype=torch.bfloat16)
        return self(eye).float().t()

    def dense_bf16(self) -> torch.Tensor:
        """W [N, K] in bf16: (q - 8) * scale + zero per group, as the int4 kernel computes it."""
        n, k = self.shape
        q = torch.stack([self.codes & 0xF, self.codes >> 4], dim=-1).view(n, k // INT4_GROUP, INT4_GROUP)
        sz = self.scales_and_zeros.transpose(0, 1).float()  # [N, K / G, 2]
        w = (q.float() - 8.0) * sz[..., :1] + sz[..., 1:]
        return w.view(n, k).to(torch.bfloat16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, N]
        if x.shape[0] >= DENSE_MIN_ROWS:
            return torch.nn.functional.linear(x.to(torch.bfloat16), self.dense_bf16()).to(x.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(torch.bfloat16), self.qweight, INT4_GROUP, self.scales_and_zeros
        )
        return y.to(x.dtype)


def quantizable(w: torch.Tensor, mode: str) -> bool:
    return w.shape[1] % (8 if mode == "int8" else INT4_GROUP) == 0


def quantize_weight(w: torch.Tensor, mode: str) -> CpuInt8Weight | CpuInt4Weight:
    return CpuInt8Weight(w) if mode == "int8" else CpuInt4Weight(w)


def mode_for_bits(bits: int | None) -> str:
    """The CPU mode that keeps a checkpoint tensor's precision: 4-bit blocks -> int4, 5..8-bit -> int8."""
    if bits is None or bits > 8:
        return "none"
    return "int4" if bits <= 4 else "int8"
