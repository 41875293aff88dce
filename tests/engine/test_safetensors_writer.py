"""engine/formats/safetensors_writer.py: a file written tensor by tensor from pieces reads back with
safetensors itself, every dtype the KV caches hold, empty tensors too; a piece count that does not add up
to the declared shape is refused."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from engine.formats.safetensors_writer import Entry, write


def _pieces(t: torch.Tensor, rows: int):
    return lambda: (t[i : i + rows] for i in range(0, len(t), rows))


def test_pieces_read_back_as_the_tensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(7, 3, generator=g),
        "bf16": torch.randn(5, 4, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, 2, 2, generator=g).half(),
        "i8": torch.randint(-128, 127, (9, 8), dtype=torch.int8, generator=g),
        "u8": torch.randint(0, 255, (3, 16), dtype=torch.uint8, generator=g),
        "fp8": torch.randn(6, 4, generator=g).to(torch.float8_e4m3fn),
        "empty": torch.zeros(0, 4, 2),
    }
    path = tmp_path / "t.safetensors"
    write(
        str(path), [Entry(n, t.dtype, tuple(t.shape), _pieces(t, 2)) for n, t in tensors.items()], {"a": "b"}
    )
    back = load_file(path)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name].view(torch.uint8), t.view(torch.uint8)) if t.numel() else True
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"a": "b"}


def test_pieces_that_do_not_fill_the_shape_are_refused(tmp_path):
    t = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="tensor x: 16 bytes written, 32 declared"):
        write(str(tmp_path / "t.safetensors"), [Entry("x", t.dtype, (4, 2), _pieces(t[:2], 2))], {})
