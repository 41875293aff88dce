"""A safetensors file written tensor by tensor, each from pieces (rows gathered a slice at a time), so a file
larger than the memory left free can be written: the header (names, dtypes, shapes, offsets) is known up
front from the shapes, then each tensor's bytes follow in order. Read back with safetensors itself. Also the
dtype names and the header's opening the .ninfer container's writer (engine/formats/container.py) uses."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


@dataclass
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: Callable[[], Iterator[torch.Tensor]]  # the tensor's rows in order, as CPU tensors

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def header_bytes(header: dict) -> bytes:
    """A safetensors file's opening: the header's length (8 bytes, little-endian), then the header JSON,
    padded with spaces so the data starts 8-byte aligned."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write(path: str, entries: list[Entry], metadata: dict[str, str]) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    with open(path, "wb") as f:
        f.write(header_bytes(header))
        for e in entries:
            written = 0
            for piece in e.pieces():
                if piece.numel():
                    data = piece.contiguous().view(torch.uint8).numpy()
                    f.write(memoryview(data).cast("B"))
                    written += data.nbytes
            if written != e.nbytes:
                raise ValueError(f"tensor {e.name}: {written} bytes written, {e.nbytes} declared")
