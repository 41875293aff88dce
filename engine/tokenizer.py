"""Tokenizer (HF `tokenizers`), special tokens, incremental detokenization."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from engine.chat_template import render_chat_template, with_kept_reasoning, with_taken_effort
from engine.errors import NinferError
from engine.sampling_defaults import from_generation_config

# ChatML's turn start (Qwen's templates): a hybrid model snapshots its state at a prompt's turn boundaries
TURN_TOKEN = "<|im_start|>"
# texts this long are encoded without holding the GIL (a batch of one: same ids)
UNLOCKED_ENCODE_CHARS = 8192


def _token_content(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


@dataclass
class Tokenizer:
    backend: HFTokenizer
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    add_bos_token: bool = False
    extra_eos_token_ids: tuple[int, ...] = ()
    # the checkpoint's recommended sampling (generation_config.json; engine/sampling_defaults.py)
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)
    # chat template variables a render leaves out take these (--chat-template-kwargs), e.g. enable_thinking
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def hidden_token_id(self, text: str) -> int | None:
        """The id of `text` when it is one whole token that decoded text leaves out (a special token such as
        <|endoftext|>); None otherwise."""
        token_id = self.token_to_id(text)
        if token_id is None or self.decode([token_id], skip_special_tokens=True):
            return None
        return token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = [self.token_to_id(self.eos_token), *self.extra_eos_token_ids]
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) < UNLOCKED_ENCODE_CHARS:
            ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        else:  # NOTE: the batch call lets go of the GIL (the one-text call holds it), so the engine's loop
            # thread steps the running streams while a long prompt encodes (~0.4 s at 250K tokens)
            ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        bos = self.token_to_id(self.bos_token)
        if add_special_tokens and self.add_bos_token and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's raw bytes (part of a character, for some; engine/token_bytes.py)."""
        return self._byte_reader(token_id)

    @cached_property
    def vocab_bytes(self) -> tuple[bytes, ...]:
        """Every token's bytes, by id (read once; DRY's sequence breakers are found in them)."""
        from engine.token_bytes import vocab_bytes

        return vocab_bytes(self.backend, self.vocab_size)

    @cached_property
    def token_lengths(self) -> np.ndarray:
        """[vocab] int64: every token's length in bytes, by id (where a prompt's tokens fall in its text)."""
        return np.fromiter(map(len, self.vocab_bytes), dtype=np.int64, count=len(self.vocab_bytes))

    @cached_property
    def _byte_reader(self):
        from engine.token_bytes import token_byte_reader

        return token_byte_reader(self.backend)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        if not self.chat_template:
            raise NinferError("this model has no chat template; use generate() with a plain prompt instead")
        variables = with_kept_reasoning(self.chat_template, messages, {**self.template_kwargs, **kwargs})
        variables = with_taken_effort(self.chat_template, variables)
        return render_chat_template(
            self.chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            pad_token=self.pad_token or "",
            unk_token=self.unk_token or "",
            **variables,
        )

    def encode_chat(self, messages, tools=None, add_generation_prompt=True, **kwargs) -> list[int]:
        text = self.apply_chat_template(messages, tools, add_generation_prompt, **kwargs)
        # NOTE: the template writes BOS itself where the model wants one (as transformers does)
        return self.encode(text, add_special_tokens=False)

    @staticmethod
    def from_hf_dir(path: Path) -> Tokenizer | None:
        """Load tokenizer.json plus tokenizer_config.json / chat_template.jinja; None if there is none."""
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            return None
        try:
            backend = HFTokenizer.from_file(str(tok_file))
        except Exception as e:  # noqa: BLE001 - the tokenizers error text is what the user needs
            raise NinferError(f"cannot read {tok_file}: {e}") from e
        cfg: dict[str, Any] = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            cfg = json.loads(cfg_file.read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            named = {t["name"]: t["template"] for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        gen_cfg_file = path / "generation_config.json"
        extra_eos: tuple[int, ...] = ()
        sampling: dict[str, float | int] = {}
        if gen_cfg_file.is_file():
            gen_cfg = json.loads(gen_cfg_file.read_text())
            eos = gen_cfg.get("eos_token_id")
            extra_eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            sampling = from_generation_config(gen_cfg)
        return Tokenizer(
            backend=backend,
            chat_template=template,
            bos_token=_token_content(cfg.get("bos_token")),
            eos_token=_token_content(cfg.get("eos_token")),
            pad_token=_token_content(cfg.get("pad_token")),
            unk_token=_token_content(cfg.get("unk_token")),
            add_bos_token=bool(cfg.get("add_bos_token", False)),
            extra_eos_token_ids=extra_eos,
            sampling_defaults=sampling,
        )


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything each step.

    Holds back a delta that ends in an incomplete UTF-8 sequence until the next token completes it;
    `flush` at the end gives what is held back, an incomplete sequence as U+FFFD (as llama-server does).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        prefix, full = self._unread()
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        # keep a few tokens of context so merges across the boundary decode correctly
        self.prefix_offset = max(self.read_offset - 4, 0)
        self.read_offset = len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """The text held back at the end of the output: bytes no token completed, each as U+FFFD."""
        prefix, full = self._unread()
        self.prefix_offset = self.read_offset = len(self.token_ids)
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self.text += delta
        return delta

    def _unread(self) -> tuple[str, str]:
        """(the text of the context tokens kept before the unread ones, that text with the unread ones)."""
        decode = self.tokenizer.decode
        prefix = decode(self.token_ids[self.prefix_offset : self.read_offset], self.skip_special_tokens)
        return prefix, decode(self.token_ids[self.prefix_offset :], self.skip_special_tokens)


def with_chat_template(tokenizer: Tokenizer | None, path: str | None) -> Tokenizer | None:
    """The tokenizer with the chat template of the Jinja file at `path` (--chat-template), checked by
    rendering a conversation; unchanged without one."""
    if path is None:
        return tokenizer
    if tokenizer is None:
        raise NinferError("--chat-template needs a tokenizer, and this model has none")
    file = Path(path).expanduser()
    try:
        template = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise NinferError(f"--chat-template {path}: cannot read it ({e.__class__.__name__}: {e})") from None
    return _rendering(
        replace(tokenizer, chat_template=template), f"--chat-template {path} does not render a conversation"
    )


def with_template_kwargs(tokenizer: Tokenizer | None, pairs: tuple[tuple[str, Any], ...]) -> Tokenizer | None:
    """The tokenizer whose chat template renders with these variables unless a request gives its own
    (--chat-template-kwargs), checked by rendering a conversation; unchanged without any."""
    if not pairs:
        return tokenizer
    if tokenizer is None or not tokenizer.chat_template:
        raise NinferError("--chat-template-kwargs needs a chat template, and this model has none")
    return _rendering(
        replace(tokenizer, template_kwargs=dict(pairs)),
        "--chat-template-kwargs: the chat template does not render a conversation with them",
    )


def _rendering(tokenizer: Tokenizer, failure: str) -> Tokenizer:
    """`tokenizer`, once its chat template has rendered a conversation (else `failure`: Jinja's reason)."""
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    except Exception as e:  # noqa: BLE001 - Jinja's own message says where the template is wrong
        raise NinferError(f"{failure}: {e}") from None
    return tokenizer
