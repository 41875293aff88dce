"""Reading a GGUF file's header: the gguf package's reader against engine/formats/gguf_file.py, side by
side in one process, on the embedded default model (or MODEL.gguf): seconds per read (median of
--repeat, alternating), their ratio, and that both read the same fields and tensors (checked).

    python benchmarks/gguf_header.py [MODEL.gguf] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np

import engine.formats.gguf as gguf_format
from engine import LLM
from engine.formats.gguf_file import GGUFFile
from engine.models.loader import default_model_path


def _timed(read, path) -> tuple[float, object]:
    start = time.perf_counter()
    header = read(path)
    return time.perf_counter() - start, header


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    path = str(args.model or default_model_path())
    times: dict[str, list[float]] = {"gguf": [], "ninfer": []}
    for _ in range(args.repeat):
        t, ref = _timed(gguf.GGUFReader, path)
        times["gguf"].append(t)
        t, got = _timed(GGUFFile, path)
        times["ninfer"].append(t)
    fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert fields == {k: f.contents() for k, f in got.fields.items()}, "the fields differ"
    assert all(
        a.name == b.name and a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data)
        for a, b in zip(ref.tensors, got.tensors, strict=True)
    ), "the tensors differ"
    vocab = len(fields.get("tokenizer.ggml.tokens", []))
    old, new = statistics.median(times["gguf"]), statistics.median(times["ninfer"])
    print(f"# {path}: {len(fields)} fields ({vocab} vocabulary entries), {len(got.tensors)} tensors")
    print("| gguf.GGUFReader s | GGUFFile s | ratio |")
    print("| ---: | ---: | ---: |")
    print(f"| {old:.3f} | {new:.3f} | {old / new:.1f}x |")
    starts: dict[str, list[float]] = {"gguf": [], "ninfer": []}
    for _ in range(args.repeat):
        for name, reader in (("gguf", gguf.GGUFReader), ("ninfer", GGUFFile)):
            gguf_format.GGUFFile = reader  # what engine/formats/gguf.py parses the file with
            gguf_format._parsed.cache_clear()
            starts[name].append(_timed(LLM, path)[0])
    gguf_format.GGUFFile = GGUFFile
    old, new = statistics.median(starts["gguf"]), statistics.median(starts["ninfer"])
    print("\n| LLM() with gguf.GGUFReader s | with GGUFFile s | ratio |")
    print("| ---: | ---: | ---: |")
    print(f"| {old:.2f} | {new:.2f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
