"""A GGUF file's header read in one pass: its metadata as Python values and its tensors as read-only
numpy maps of the file, shaped as the `gguf` package's reader shapes them (so the code that reads them
takes either).

The package's reader makes a numpy view for every part of every field: seconds for a 50K-150K token
vocabulary, on every start. This one unpacks the header with `struct` and numeric arrays with one
`np.frombuffer` each; only the vocabulary's strings are walked one by one.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType

# GGUF value types: numeric ones by struct code (little-endian), then string (8) and array (9)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# tensor types the file stores as plain numbers (others: blocks of bytes)
_PLAIN = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@functools.cache
def _layout(fmt: str) -> struct.Struct:
    """A little-endian struct format, compiled once (the header is unpacked field by field)."""
    return struct.Struct("<" + fmt)


class GGUFField(NamedTuple):
    name: str
    value: Any

    def contents(self) -> Any:
        return self.value


class GGUFTensor(NamedTuple):
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # [n_dims] uint64, the fastest dimension first (as the file lists them)
    n_elements: int
    n_bytes: int
    data_offset: int
    # the file's bytes: numbers shaped [..., shape[0]] (reversed dims) for plain types; uint8 rows of
    # whole blocks [..., shape[0] / block * block bytes] for block-quantized ones
    data: np.ndarray


class GGUFFile:
    """`fields` (name -> GGUFField) and `tensors` (in file order) of a GGUF file, version 2 or 3."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        # a plain ndarray over the map: views of it skip memmap's per-view bookkeeping (the dequantizer
        # splits a tensor into thousands)
        self._map = np.memmap(self.path, mode="r").view(np.ndarray)
        self._buf = memoryview(self._map)
        self.fields: dict[str, GGUFField] = {}
        self.tensors: list[GGUFTensor] = []
        try:
            self._read()
        except (struct.error, IndexError) as e:
            raise ValueError(
                f"its header runs past the end of the file, {len(self._buf)} bytes (cut short?)"
            ) from e
        except UnicodeDecodeError as e:
            raise ValueError(f"a name or string in its header is not UTF-8 (damaged?): {e.reason}") from e

    def _unpack(self, fmt: str, offset: int) -> tuple[tuple, int]:
        layout = _layout(fmt)
        return layout.unpack_from(self._buf, offset), offset + layout.size

    def _string(self, offset: int) -> tuple[str, int]:
        (n,), offset = self._unpack("Q", offset)
        if offset + n > len(self._buf):
            raise ValueError(f"a string at byte {offset} runs past the end of the file")
        return str(self._buf[offset : offset + n], "utf-8"), offset + n

    def _value(self, kind: int, offset: int) -> tuple[Any, int]:
        if kind in _SCALARS:
            (v,), offset = self._unpack(_SCALARS[kind], offset)
            return v, offset
        if kind == _STRING:
            return self._string(offset)
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind} at byte {offset}")
        (item, count), offset = self._unpack("IQ", offset)
        if item in _SCALARS:
            dtype = np.dtype("<" + _SCALARS[item])
            end = offset + count * dtype.itemsize
            if end > len(self._buf):
                raise ValueError(f"an array at byte {offset} runs past the end of the file")
            return np.frombuffer(self._buf[offset:end], dtype).tolist(), end
        values = []
        for _ in range(count):
            v, offset = self._value(item, offset)
            if isinstance(v, list):  # arrays of arrays come flattened, as the gguf package reads them
                values.extend(v)
            else:
                values.append(v)
        return values, offset

    def _read(self) -> None:
        (magic, version), offset = self._unpack("II", 0)
        if magic != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        if version & 0xFFFF == 0:
            raise ValueError("the file is big-endian; ninfer reads little-endian GGUF files")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not one ninfer reads (2 or 3)")
        (num_tensors, num_fields), offset = self._unpack("QQ", offset)
        for _ in range(num_fields):
            name, offset = self._string(offset)
            (kind,), offset = self._unpack("I", offset)
            value, offset = self._value(kind, offset)
            if name in self.fields:
                raise ValueError(f"metadata key {name} appears twice")
            self.fields[name] = GGUFField(name, value)
        infos = []
        for _ in range(num_tensors):
            name, offset = self._string(offset)
            (n_dims,), offset = self._unpack("I", offset)
            dims = np.frombuffer(self._buf[offset : offset + 8 * n_dims], "<u8").copy()
            offset += 8 * n_dims
            (raw_type, data_offset), offset = self._unpack("IQ", offset)
            infos.append((name, dims, raw_type, data_offset))
        alignment = self.fields.get("general.alignment", GGUFField("", GGUF_DEFAULT_ALIGNMENT)).value
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment must be a power of two (got {alignment!r})")
        start = -(-offset // alignment) * alignment
        names = set()
        for name, dims, raw_type, data_offset in infos:
            if name in names:
                raise ValueError(f"tensor {name} appears twice")
            names.add(name)
            self.tensors.append(self._tensor(name, dims, raw_type, start + data_offset))

    def _tensor(self, name: str, dims: np.ndarray, raw_type: int, offset: int) -> GGUFTensor:
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ValueError(
                f"tensor {name} has type {raw_type}, which this gguf package does not know"
            ) from None
        n = int(np.prod(dims, dtype=np.uint64)) if len(dims) else 1
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        shape = tuple(int(d) for d in reversed(dims.tolist()))
        if qtype in _PLAIN:
            dtype, count = np.dtype(_PLAIN[qtype]), n
        else:
            if not shape or shape[-1] % block:
                raise ValueError(
                    f"tensor {name}'s rows ({shape}) are not whole {qtype.name} blocks of {block}"
                )
            dtype, count = np.dtype(np.uint8), n // block * block_bytes
            shape = (*shape[:-1], shape[-1] // block * block_bytes)
        n_bytes = n * block_bytes // block
        if offset + count * dtype.itemsize > len(self._buf):
            raise ValueError(f"tensor {name}'s data runs past the end of the file (cut short?)")
        data = self._map[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape)
        return GGUFTensor(name, qtype, dims, n, n_bytes, offset, data)
