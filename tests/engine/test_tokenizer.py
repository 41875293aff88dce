"""The GGUF-built BPE tokenizer vs transformers' tokenizer from the same file; incremental decoding."""

from __future__ import annotations

import threading
import time

import pytest

from engine import tokenizer
from engine.tokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nand newlines\n\n",
    "def f(x):\n    return x ** two  # comment",
    "Ünïcödé — “quotes” and emoji 🙂🚀 and 漢字",
    "你好，世界！这是一个关于长上下文推理的测试。👩‍💻🇫🇷",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_matches_transformers(default_tokenizer, hf_default_tokenizer, text):
    ids = default_tokenizer.encode(text, add_special_tokens=False)
    assert ids == hf_default_tokenizer.encode(text, add_special_tokens=False)
    assert default_tokenizer.decode(ids, skip_special_tokens=False) == text
    assert default_tokenizer.decode(ids) == hf_default_tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_a_long_text_encodes_as_transformers_does(
    default_tokenizer, hf_default_tokenizer, add_special_tokens
):
    text = "".join(TEXTS) * (tokenizer.UNLOCKED_ENCODE_CHARS // len("".join(TEXTS)) + 1)
    assert len(text) >= tokenizer.UNLOCKED_ENCODE_CHARS  # (through the batch call)
    want = hf_default_tokenizer.encode(text, add_special_tokens=add_special_tokens)
    assert default_tokenizer.encode(text, add_special_tokens=add_special_tokens) == want


def test_other_threads_run_while_a_long_prompt_encodes(default_tokenizer):
    # the engine's loop thread steps running streams while the server encodes a long prompt: a thread
    # counting while the encode runs gets on (holding the GIL, it got ~2 counts in the whole encode)
    text = "def handler(self, request):\n    return self.route(request.path)  # 漢字 🙂\n" * 6000
    counts, done = [0], threading.Event()

    def count():
        while not done.is_set():
            counts[0] += 1
            time.sleep(0)

    thread = threading.Thread(target=count)
    thread.start()
    while counts[0] == 0:
        time.sleep(0.001)
    before = counts[0]
    default_tokenizer.encode(text, add_special_tokens=False)
    during = counts[0] - before
    done.set()
    thread.join()
    assert during > 100, f"the counting thread ran {during} times while the prompt encoded"


def test_digits_split_one_by_one(default_tokenizer):
    # SmolLM2's pre-tokenizer (llama.cpp 'smollm') splits numbers into single digits
    ids = default_tokenizer.encode("2024", add_special_tokens=False)
    assert [default_tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_special_tokens(default_tokenizer):
    assert default_tokenizer.eos_token == "<|im_end|>"
    assert default_tokenizer.bos_token == "<|im_start|>"
    # the GGUF names <|im_end|>; <|endoftext|> (a control token) ends a generation too, as in llama.cpp
    assert default_tokenizer.eos_token_ids == (2, 0)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_equals_full_decode(default_tokenizer, text):
    ids = default_tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(default_tokenizer, skip_special_tokens=False)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_flush_gives_the_bytes_no_token_completed_as_replacement_characters(default_tokenizer):
    first, second = default_tokenizer.encode(
        "🙂", add_special_tokens=False
    )  # the emoji's bytes in two tokens
    detok = IncrementalDetokenizer(default_tokenizer)
    assert detok.push(default_tokenizer.encode("Hi", add_special_tokens=False)[0]) == "Hi"
    assert detok.push(first) == ""  # held back: the next token may complete the character
    assert detok.flush() == "\ufffd" and detok.text == "Hi\ufffd"
    assert detok.flush() == ""  # nothing is given twice
    whole = IncrementalDetokenizer(default_tokenizer)
    assert [whole.push(first), whole.push(second), whole.flush()] == ["", "🙂", ""]


def test_hidden_token_ids_are_those_decoding_leaves_out(default_tokenizer, fim_tokenizer):
    assert default_tokenizer.hidden_token_id("<|im_end|>") == 2
    assert default_tokenizer.hidden_token_id("<|endoftext|>") == 0
    assert default_tokenizer.hidden_token_id("hello") is None  # text decodes to itself
    assert default_tokenizer.hidden_token_id("<|no_such_token|>") is None
    assert fim_tokenizer.hidden_token_id("<|fim_prefix|>") is None  # a token, but not special: it shows
