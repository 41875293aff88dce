"""The engine's module base class: calling a module runs its forward directly, unless a hook is registered.

nn.Module.__call__ goes through a dozen hook registries and tracing checks before forward (~1.5 us a
call); a CPU decode step of the embedded model makes ~330 module calls (3–5% of the step, measured:
docs/benchmarks.md). The engine registers hooks only for GPTQ calibration (engine/quant/hessians.py): a
module with hooks of its own, or any global module hook, still takes torch's full call, so those fire.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _torch_module

# torch's global hook registries (dicts it mutates in place; an older torch without one has nothing there)
_PRE, _POST, _BACK_PRE, _BACK = (
    getattr(_torch_module, name, {})
    for name in (
        "_global_forward_pre_hooks",
        "_global_forward_hooks",
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
    )
)


class Module(nn.Module):
    def __call__(self, *args, **kwargs):
        hooked = self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks
        if hooked or self._backward_hooks or _PRE or _POST or _BACK_PRE or _BACK:
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)
