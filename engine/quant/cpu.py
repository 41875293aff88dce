"""Weight-only int8 / int4 linear weights for the CPU.

Decode on a CPU is bound by reading weights, so fewer bytes per weight is the lever: int4 reads an
eighth of fp32.

* int4: groups of INT4_GROUP input columns, asymmetric: w = scale * q + lo, q in [0, 15]. A GGUF
  Q4_0 / Q4_1 block (32 weights, w = q * d + m) is exactly such a group, so a 4-bit GGUF keeps its
  weights (the scales rounded to fp16 on the native kernel, kernels/q4_cpu, to bf16 on torch's int4
  kernel, whose bf16 activations go x -> bf16 -> matmul -> back). Long prefill chunks run a bf16 GEMM on
  the weight unpacked from the kernel's own packing, so the codes are held once.
* int8: per output channel, symmetric: w = q * scale, q in [-127, 127].
"""

from __future__ import annotations

import warnings

import torch

import ninfer_kernels.q4_cpu as q4_cpu

INT4_GROUP = 32
# from this many rows on (prefill), an int4 layer unpacks its weight to bf16 and runs the bf16 GEMM: on
# this CPU class that is ~2.5x faster than the int4 kernel at M = 2048, and the unpack is cheap beside it
DENSE_MIN_ROWS = 64
# the same for the native int4 kernel (kernels/q4_cpu), whose rows cost less: it matches unpack + bf16 GEMM
# at ~1024 rows here (576 x 3072 and 1536 x 576), and is 2-4x faster below 256
NATIVE_DENSE_MIN_ROWS = 512
MODES = ("none", "int8", "int4")


def _fbgemm_linear() -> bool:
    """Whether this torch has the prepacked int8 x86 matmul (fbgemm's dynamic linear)."""
    ops = torch.ops.quantized
    engines = torch.backends.quantized.supported_engines
    return hasattr(ops, "linear_dynamic") and hasattr(ops, "linear_prepack") and "fbgemm" in engines


FBGEMM = _fbgemm_linear()


def _bf16_gemm_native() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (oneDNN's bf16 path: AVX-512 or AMX). Without it
    torch's bf16 GEMM is emulated, ~70x slower than fp32 (758 ms against 10.7 ms for 512 x 576 x 1536,
    measured on an AVX2 CPU), so long prefill chunks multiply in fp32 there."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


BF16_GEMM = _bf16_gemm_native()
_REDUCE_RANGE: bool | None = None


def fbgemm_reduce_range() -> bool:
    """Whether fbgemm's int8 matmul needs 7-bit activations on this CPU (probed once). Without VNNI its
    u8 x s8 products are summed in pairs into int16 (VPMADDUBSW), which saturates for activations near
    255 against weights near 127 (a 12% error measured on an AVX2 CPU); 7-bit activations cannot."""
    global _REDUCE_RANGE
    if _REDUCE_RANGE is None:
        g = torch.Generator().manual_seed(0)
        n, k = 64, 256
        q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
        q[:, ::2] = 127  # the pairs that saturate int16 where the activations are near their maximum
        scales = torch.full((n,), 0.01, dtype=torch.double)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(q, scales, torch.zeros(n, dtype=torch.long), 0)
            x = torch.rand(4, k, generator=g)
            x[:, ::2] = 1.0
            y = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(qw, None), False)
        want = x @ (q.float() * 0.01).t()
        _REDUCE_RANGE = bool((y - want).norm() > 1e-2 * want.norm())
    return _REDUCE_RANGE


class CpuInt8Weight:
    """int8 weights (per output channel, symmetric) times int8 activations: the dot products run on the
    CPU's integer units (VNNI), faster than any float path here.

    Each activation row goes in twice in the same matmul, x ~ q1 s + q2 s / a (q2 quantizes what q1 left
    over, scaled up by a): ~15-bit activations for the price of one weight read, where a single int8 row
    moved a head's logprobs by ~0.2. With fbgemm (x86 builds of torch) the weight is prepacked once and the
    activations are quantized per tensor by the op itself (0.4 ms instead of 1.9 ms for a 49152 x 576 head
    at M = 1 on a 2-core AVX-512 VM), on 7 bits where the CPU's fbgemm kernel would saturate 8
    (`fbgemm_reduce_range`); elsewhere `_int_mm` with rows quantized per token.
    """

    def __init__(self, w: torch.Tensor):
        # w: [N, K]
        w = w.float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [N]
        qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()  # [N, K]
        self.scales = scales
        self.shape = tuple(w.shape)
        self.packed = None
        if FBGEMM:
            with warnings.catch_warnings():  # torch flags its quantized tensors as deprecated (once)
                warnings.simplefilter("ignore")
                qw = torch._make_per_channel_quantized_tensor(
                    qweight, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0
                )
                self.packed = torch.ops.quantized.linear_prepack(qw, None)
                self(torch.zeros(1, self.shape[1]))  # the activation path's own deprecation notice, silenced
        else:
            self.qweight_t = qweight.t()  # [K, N] view: the GEMV then streams each output's K weights

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.quantized.linear_unpack(self.packed)[0].dequantize()
        return self.qweight_t.t().float() * self.scales[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, N]
        m = x.shape[0]
        xf = x.float()
        if self.packed is not None:
            return self._fbgemm(xf).to(x.dtype)
        s1 = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # [M, 1]
        q1 = torch.round(xf / s1)
        rest = xf - q1 * s1
        s2 = rest.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        q2 = torch.round(rest / s2)
        y = torch._int_mm(torch.cat([q1, q2]).to(torch.int8), self.qweight_t).float()  # [2M, N]
        return ((y[:m] * s1 + y[m:] * s2) * self.scales).to(x.dtype)

    def _fbgemm(self, x: torch.Tensor) -> torch.Tensor:
        """The op quantizes its input per tensor. Rows are first scaled to a max |x| of 1 (so one large
        token, e.g. a prompt's first, does not coarsen the others' grid), then quantized on the grid
        quantize_per_tensor_dynamic picks (the op's own rule); the residual rows, scaled by `a` to stay
        inside that range, reuse the grid exactly."""
        m = x.shape[0]
        row_max = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)  # [M, 1]
        x = x / row_max
        reduce = fbgemm_reduce_range()
        qx = torch.quantize_per_tensor_dynamic(x, torch.quint8, reduce)
        lo, hi = torch.aminmax(x)
        a = 0.999 * min(-lo.item(), hi.item()) / (qx.q_scale() / 2)
        if a <= 1.0:  # x all of one sign: the grid still holds 0, but leaves the residual no room
            return torch.ops.quantized.linear_dynamic(x, self.packed, reduce).mul_(row_max)
        y = torch.ops.quantized.linear_dynamic(
            torch.cat([x, (x - qx.dequantize()).mul_(a)]), self.packed, reduce
        )
        return y[m:].div_(a).add_(y[:m]).mul_(row_max)  # [M, N]


# torch's int4 CPU packing (AVX-512 builds, probed): blocks of 64 output rows stored as [K, 32] bytes, byte j
# of column k holding rows j (low nibble) and j + 32 (high nibble); a tail of fewer rows is packed otherwise
PACK_BLOCK_N = 64
_PACKING_KNOWN: bool | None = None


def unpack_int4pack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Codes [N, K] uint8 from `_convert_weight_to_int4pack_for_cpu`'s output, N a multiple of PACK_BLOCK_N."""
    blocks = packed.view(n // PACK_BLOCK_N, k, PACK_BLOCK_N // 2).transpose(1, 2)  # [N / 64, 32, K]
    return torch.cat([blocks & 0xF, blocks >> 4], dim=1).view(n, k)  # per block: rows j, then j + 32


def packing_known() -> bool:
    """Whether this torch packs int4 as unpack_int4pack reads it (checked once, on a random matrix): the
    packing is the kernel's own and may differ between builds; where it does, codes are kept twice."""
    global _PACKING_KNOWN
    if _PACKING_KNOWN is None:
        q = torch.randint(
            0, 16, (2 * PACK_BLOCK_N, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0)
        )
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        _PACKING_KNOWN = packed.dtype == torch.uint8 and packed.numel() * 2 == q.numel()
        _PACKING_KNOWN = _PACKING_KNOWN and torch.equal(unpack_int4pack(packed, *q.shape).to(torch.int32), q)
    return _PACKING_KNOWN


class CpuInt4Weight:
    """int4 weights, asymmetric groups of INT4_GROUP: w = scale * q + lo, q in [0, 15].

    Up to `dense_min_rows` rows run the native kernel (kernels/q4_cpu: int8 activations on the CPU's
    VNNI or AVX2 integer dot products) where it is built and the scales fit fp16, else torch's int4
    kernel on bf16 activations; more rows (long prefill chunks) unpack the weight to bf16 for the dense
    GEMM (its values to fp32, where the CPU has no native bf16 GEMM: BF16_GEMM). The codes are held once
    either way.
    """

    def __init__(self, w: torch.Tensor):
        # w: [N, K], K a multiple of INT4_GROUP
        n, k = w.shape
        g = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [N, K / G]
        scale = ((hi - lo) / 15.0).clamp(min=1e-12)
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
        self._hold(q, scale, lo)

    @classmethod
    def from_codes(cls, q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> CpuInt4Weight:
        """The weight w = scale * q + lo as it is (q [N, K] in 0..15; scale, lo [N, K / INT4_GROUP]), as a
        GGUF's Q4_0 / Q4_1 blocks hold it: no second rounding. (A Q4_0 block's scale may be negative.)"""
        weight = cls.__new__(cls)
        weight._hold(q, scale.float(), lo.float())
        return weight

    def _hold(self, q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> None:
        """Pack the codes for the kernel that will run them (q [N, K]; scale, lo [N, K / G])."""
        n, k = q.shape
        self.shape = (n, k)
        self.native = self.qweight = self.codes = self.scales_and_zeros = None
        if q4_cpu.available() and q4_cpu.supports(n, k, scale, lo):
            self.native = q4_cpu.pack(q, scale, lo)  # [N / 16, K / 32, 320] uint8
            return
        zero = lo + 8.0 * scale
        q = q.to(torch.int32)
        self.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # the prefill path reads the codes back out of the kernel's packing where its layout is known;
        # elsewhere a second copy, two per byte (even column in the low nibble)
        if n % PACK_BLOCK_N or not packing_known():
            self.codes = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # [N, K / 2]
        # [K / G, N, 2]: (scale, zero) per group, as the kernel wants them
        self.scales_and_zeros = (
            torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        )

    @property
    def nbytes(self) -> int:
        """Bytes a decode step reads (codes and group scales)."""
        if self.native is not None:
            return self.native.numel()
        return self.qweight.numel() * self.qweight.element_size() + self.scales_and_zeros.numel() * 2

    def dequantize(self) -> torch.Tensor:
        """W [N, K] fp32, exactly as the decode kernel's codes and scales give it."""
        n, k = self.shape
        if self.native is not None:
            return q4_cpu.dequantize(self.native, n, k)
        if self.codes is None:
            q = unpack_int4pack(self.qweight, n, k).view(n, k // INT4_GROUP, INT4_GROUP)
        else:
            q = torch.stack([self.codes & 0xF, self.codes >> 4], dim=-1).view(n, k // INT4_GROUP, INT4_GROUP)
        sz = self.scales_and_zeros.transpose(0, 1).float()  # [N, K / G, 2]
        return ((q.float() - 8.0) * sz[..., :1] + sz[..., 1:]).view(n, k)

    @property
    def dense_min_rows(self) -> int:
        """From this many rows on, a call unpacks the weight and runs the bf16 GEMM."""
        return NATIVE_DENSE_MIN_ROWS if self.native is not None else DENSE_MIN_ROWS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, K] -> [M, N]
        long_chunk = x.shape[0] >= self.dense_min_rows
        if self.native is not None:
            if not long_chunk:  # decode: the hot path, first and lean
                y = q4_cpu.matmul(x, self.native, self.shape[0])
                return y if x.dtype == torch.float32 else y.to(x.dtype)
            wt = q4_cpu.dequantize_t_bf16(self.native, *self.shape)  # [K, N], unpacked in C
            if not BF16_GEMM:
                return (x.float() @ wt.float()).to(x.dtype)
            return (x.to(torch.bfloat16) @ wt).to(x.dtype)
        if long_chunk:
            dense = torch.bfloat16 if BF16_GEMM else torch.float32
            return torch.nn.functional.linear(x.to(dense), self.dequantize().to(dense)).to(x.dtype)
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
