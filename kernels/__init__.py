"""Public ops of ninfer. Each op has a naive torch twin (fp32 reference) under kernels/<op>/naive.py.

Dispatch: Triton on CUDA tensors where an op has a Triton implementation, the naive twin elsewhere;
NINFER_KERNELS=naive|triton forces one. Triton implementations land op by op; until an op has one,
every device runs its naive twin.

NOTE: `kernels` is also the import name of a Hugging Face library that transformers probes; keep this
module free of import-time side effects and without a `__version__`.
"""

from kernels.conv1d.naive import causal_conv1d
from kernels.gated_delta.naive import gated_delta_rule
from kernels.kv_store.naive import kv_store
from kernels.paged_attention.naive import paged_attention
from kernels.rmsnorm.naive import rmsnorm, rmsnorm_gated
from kernels.rope.naive import rope
from kernels.silu_mul.naive import silu_mul

__all__ = [
    "causal_conv1d",
    "gated_delta_rule",
    "kv_store",
    "paged_attention",
    "rmsnorm",
    "rmsnorm_gated",
    "rope",
    "silu_mul",
]
