"""engine.layers.module.Module: a call runs forward directly, and any hook still fires through torch's call."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.module import Module


class Double(Module):
    def forward(self, x):
        return 2 * x


def test_a_call_without_hooks_skips_torchs_call_machinery(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nn.Module's call path ran")

    monkeypatch.setattr(nn.Module, "_call_impl", refuse)
    assert torch.equal(Double()(torch.ones(2)), torch.full((2,), 2.0))


def test_module_and_global_hooks_still_fire():
    m, seen = Double(), []
    handle = m.register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    m.register_forward_hook(lambda mod, args, out: seen.append("post"))
    m(torch.ones(1))
    assert seen == ["pre", "post"]
    handle.remove()
    seen.clear()
    glob = nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append("global"))
    try:
        out = Double()(torch.ones(1))
    finally:
        glob.remove()
    assert seen == ["global"] and out.item() == 2.0
