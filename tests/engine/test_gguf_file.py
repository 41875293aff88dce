"""engine/formats/gguf_file.py reads what the gguf package's reader reads (every metadata value type, plain
and block-quantized tensors, a custom alignment, the embedded default model), and a damaged file is
refused in one line."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine import LLM, NinferError
from engine.formats.gguf_file import GGUFFile
from engine.models.loader import default_model_path

Q = gguf.GGMLQuantizationType


def _same(path):
    ref, got = gguf.GGUFReader(str(path)), GGUFFile(path)
    want = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    have = {k: f.contents() for k, f in got.fields.items()}
    assert want.keys() == have.keys()
    for key, value in want.items():
        assert have[key] == value and type(have[key]) is type(value), key
    assert [t.name for t in got.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ref.tensors, got.tensors):
        assert (a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (
            b.tensor_type,
            b.n_elements,
            b.n_bytes,
            b.data_offset,
        ), a.name
        assert a.shape.tolist() == b.shape.tolist() and a.data.dtype == b.data.dtype, a.name
        assert a.data.shape == b.data.shape and np.array_equal(a.data, b.data), a.name
    return got


def _write(path, alignment: int | None = None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**60)
    w.add_int64("t.i64", -(2**60))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strs", ["a", "", "ünïcode", "<|im_end|>"])
    w.add_array("t.empty", [])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5), dtype=np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    w.add_tensor(
        "q8", gguf.quants.quantize(rng.standard_normal((4, 64), dtype=np.float32), Q.Q8_0), raw_dtype=Q.Q8_0
    )
    w.add_tensor(
        "q4k", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=Q.Q4_K
    )  # two rows of one 256-value block (144 bytes): the bytes are what is compared
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_and_tensor_type_reads_as_the_gguf_package_reads_it(tmp_path, alignment):
    got = _same(_write(tmp_path / "t.gguf", alignment))
    assert got.fields["t.strs"].contents() == ["a", "", "ünïcode", "<|im_end|>"]
    assert got.fields["t.u64"].contents() == 2**60 and got.fields["t.bool"].contents() is True


def test_the_default_model_reads_the_same():
    got = _same(default_model_path())
    assert len(got.fields["tokenizer.ggml.tokens"].contents()) == 49152


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda b: b"GGUX" + b[4:], "GGUF magic invalid"),
        (lambda b: b[:200], "cut short"),  # inside the metadata
        (lambda b: b[: len(b) - 40], "runs past the end of the file (cut short?)"),  # inside the last tensor
        (lambda b: b[:4] + (99).to_bytes(4, "little") + b[8:], "GGUF version 99 is not one ninfer reads"),
    ],
)
def test_a_damaged_file_is_refused_in_one_line(tmp_path, damage, says):
    path = _write(tmp_path / "t.gguf")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(NinferError) as info:
        LLM(path)
    message = str(info.value)
    assert says in message and "is not a readable GGUF file" in message and "\n" not in message
