"""The GGUF-built BPE tokenizer vs transformers' tokenizer from the same file; incremental decoding."""

from __future__ import annotations

import pytest

from engine.models.loader import default_model_path, open_source
from engine.tokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nand newlines\n\n",
    "def f(x):\n    return x ** two  # comment",
    "Ünïcödé — “quotes” and emoji 🙂🚀 and 漢字",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]


@pytest.fixture(scope="module")
def ours():
    return open_source(default_model_path()).tokenizer


@pytest.fixture(scope="module")
def hf_tok():
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_matches_transformers(ours, hf_tok, text):
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)


def test_digits_split_one_by_one(ours):
    # SmolLM2's pre-tokenizer (llama.cpp 'smollm') splits numbers into single digits
    ids = ours.encode("2024", add_special_tokens=False)
    assert [ours.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_special_tokens(ours):
    assert ours.eos_token == "<|im_end|>"
    assert ours.bos_token == "<|im_start|>"
    assert ours.eos_token_ids == (2,)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_equals_full_decode(ours, text):
    ids = ours.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(ours, skip_special_tokens=False)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
