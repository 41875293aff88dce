"""A token's raw bytes, as OpenAI's logprobs give them (`bytes`): a token may hold part of a character (a
byte-level BPE splits an emoji or a CJK character over two or three tokens), which its text alone shows as
U+FFFD; its bytes, joined with the next tokens', are the character.

Read from the tokenizer's vocabulary by the way its decoder maps tokens to text: byte-level BPE (GPT-2,
Llama 3, Qwen, SmolLM2: each byte is one printable character of a fixed table), SentencePiece with byte
fallback (Llama 2: `<0xNN>` tokens are bytes, `▁` is a space), or, for any other decoder, the token's
decoded text. Added tokens (`<|im_end|>`, `<think>`) are their text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache

from tokenizers import Tokenizer as HFTokenizer

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable Latin-1 bytes stand for themselves, the
    other 68 (control characters, space, ...) for the characters from U+0100 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _decoder_kinds(decoder: dict | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {kind for d in decoder.get("decoders", []) for kind in _decoder_kinds(d)}
    return {decoder.get("type", "")}


def decoder_kinds(backend: HFTokenizer) -> set[str]:
    """The kinds of the tokenizer's decoder (and of those a Sequence of them holds)."""
    decoder = backend.decoder
    if decoder is None:
        return set()
    try:  # the decoder's own JSON: no need to read the whole tokenizer's
        spec = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        spec = json.loads(backend.to_str()).get("decoder")
    return _decoder_kinds(spec)


def vocab_bytes(backend: HFTokenizer, vocab_size: int) -> tuple[bytes, ...]:
    """Every token's bytes, by id: what `token_byte_reader` reads for each, read in bulk where the
    vocabulary is byte-level BPE (its pieces translated to bytes by the alphabet in one pass each)."""
    read = token_byte_reader(backend)
    if "ByteLevel" not in decoder_kinds(backend):
        return tuple(map(read, range(vocab_size)))
    pieces: list[str | None] = [None] * vocab_size
    for piece, token_id in backend.get_vocab(with_added_tokens=False).items():
        if token_id < vocab_size:
            pieces[token_id] = piece
    added = backend.get_added_tokens_decoder()
    alphabet = {ord(c): b for c, b in byte_level_table().items()}
    out = []
    for token_id, piece in enumerate(pieces):
        if piece is None or token_id in added:
            out.append(read(token_id))
            continue
        try:  # a character outside the alphabet stays above 255: not Latin-1, read the slow way
            out.append(piece.translate(alphabet).encode("latin-1"))
        except UnicodeEncodeError:
            out.append(read(token_id))
    return tuple(out)


def token_byte_reader(backend: HFTokenizer) -> Callable[[int], bytes]:
    """token id -> its bytes, for this tokenizer (see the module's docstring)."""
    kinds = decoder_kinds(backend)
    added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
    table = byte_level_table()

    def read(token_id: int) -> bytes:
        if token_id in added:
            return added[token_id].encode()
        piece = backend.id_to_token(token_id)
        if piece is None:  # past the vocabulary (a padded head)
            return b""
        if "ByteLevel" in kinds and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        if "ByteFallback" in kinds:
            byte = BYTE_TOKEN.fullmatch(piece)
            return bytes([int(byte.group(1), 16)]) if byte else piece.replace("▁", " ").encode()
        return backend.decode([token_id], skip_special_tokens=False).encode()

    return read
