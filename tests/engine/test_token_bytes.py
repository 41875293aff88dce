"""A token's raw bytes (OpenAI's logprobs `bytes`) for each kind of tokenizer decoder: byte-level BPE,
SentencePiece with byte fallback, any other (its decoded text), and added tokens (their text)."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from engine.token_bytes import byte_level_table, token_byte_reader, vocab_bytes

TEXT = "Sí: 😀 日本\n"


def _byte_level() -> Tokenizer:
    table = byte_level_table()
    vocab = {c: i for i, c in enumerate(sorted(table, key=table.get))}  # one token a byte
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_fallback() -> Tokenizer:
    vocab = {"<unk>": 0, "▁": 1, "S": 2, ":": 3, **{f"<0x{b:02X}>": 4 + b for b in range(256)}}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _word_level() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "日本": 1, "word": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    return tok


@pytest.mark.parametrize("build", [_byte_level, _byte_fallback])
def test_the_tokens_bytes_join_into_the_text(build):
    tok = build()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    ids = tok.encode(TEXT + "<|im_end|>").ids
    read = token_byte_reader(tok)
    assert b"".join(read(i) for i in ids) == (TEXT + "<|im_end|>").encode()
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # a token that holds part of a character
    assert read(tok.token_to_id("<|im_end|>")) == b"<|im_end|>"
    assert read(10**6) == b""  # past the vocabulary (a padded head)


def test_another_decoder_gives_the_decoded_text():
    tok = _word_level()
    read = token_byte_reader(tok)
    assert read(1) == "日本".encode() and read(2) == b"word"


def test_the_byte_level_table_covers_every_byte_once():
    table = byte_level_table()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["A"] == ord("A") and table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n")


@pytest.mark.parametrize("build", [_byte_level, _byte_fallback, _word_level])
def test_the_whole_vocabulary_read_at_once_is_each_tokens_bytes(build):
    tok = build()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    tok.add_tokens([AddedToken("ĊĊ", special=False)])  # an added token is its text, not the alphabet's bytes
    read = token_byte_reader(tok)
    size = tok.get_vocab_size() + 2  # a head padded past the vocabulary
    assert vocab_bytes(tok, size) == tuple(read(i) for i in range(size))
