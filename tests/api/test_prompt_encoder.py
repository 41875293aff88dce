"""A rendered prompt that repeats a recent one reuses its tokens up to the last special token the two share
(engine/api/prompt_encoder.py): the ids are always the tokenizer's own for the whole text, whatever the
texts hold and wherever they part; tokenizers whose tokens' bytes do not add up to the text encode whole."""

from __future__ import annotations

import random
from dataclasses import replace

import httpx2 as httpx
import pytest
from scripted_engine import ScriptedEngine
from server import RunningServer
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from engine.api import prompt_encoder
from engine.api.prompt_encoder import PromptEncoder
from engine.async_llm import AsyncLLM
from engine.tokenizer import Tokenizer

PIECES = [
    "<think>\n",
    "</think>",
    "word ",
    "def f(x):\n    return x\n",
    "  ",
    "\n\n",
    "0.5 ",
    "é漢字🙂",
    "<|im_end|>",
    "<|im_sta",
    "\t",
]


@pytest.fixture(autouse=True)
def short_shared_heads(monkeypatch):
    monkeypatch.setattr(prompt_encoder, "MIN_SHARED", 64)  # the tests' conversations are short


def _conversations(tokenizer: Tokenizer, seed: int):
    """Agent-like prompts: each turn the conversation so far and a new message; now and then a prompt cut
    anywhere and continued otherwise (an edit, a template that parts mid-token)."""
    rng = random.Random(seed)

    def blob(n: int) -> str:
        return "".join(
            rng.choice(PIECES) if rng.random() < 0.7 else chr(rng.randint(32, 0x2FF)) for _ in range(n)
        )

    messages = [{"role": "system", "content": blob(200)}]
    for _ in range(6):
        messages.append({"role": "user", "content": blob(rng.randint(5, 150))})
        text = tokenizer.apply_chat_template(messages, None, True)
        if rng.random() < 0.3:
            text = text[: rng.randint(0, len(text))] + blob(10)
        yield text
        messages.append({"role": "assistant", "content": blob(rng.randint(5, 80))})


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("which", ["default", "thinking"])
def test_the_ids_are_the_tokenizers_own_and_the_shared_head_is_reused(
    default_tokenizer, thinking_tokenizer, which, seed
):
    """(thinking: Qwen's <think> / </think> as added tokens that are not special, in the texts too)"""
    tokenizer = default_tokenizer
    if which == "thinking":
        tokenizer = replace(thinking_tokenizer, chat_template=default_tokenizer.chat_template)
    encoder = PromptEncoder(tokenizer)
    for text in _conversations(tokenizer, seed):
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.reused > 0


def test_a_prompt_that_parts_inside_a_special_token_reuses_only_before_it(default_tokenizer):
    encoder = PromptEncoder(default_tokenizer)
    head = "<|im_start|>system\n" + "x " * 100 + "<|im_end|>\n"
    first = head + "<|im_start|>user\nhello<|im_end|>\n"
    second = head + "<|im_start|>usex<|im_end|>\n"  # (shares "<|im_start|>use")
    third = head + "<|im_sta and more"  # the special token itself cut short
    for text in (first, second, third):
        assert encoder.encode(text) == default_tokenizer.encode(text, add_special_tokens=False)
    n = len(default_tokenizer.encode(head, add_special_tokens=False))
    # the second reuses the head whole (up to the turn's <|im_start|>, which both hold); the third up to
    # the head's own <|im_end|> (the last special token it holds whole), which it encodes again with its "\n"
    assert encoder.reused == n + (n - 2)


def test_special_tokens_that_take_whitespace_are_not_where_a_prompt_splits(default_tokenizer):
    """A special token with lstrip takes the whitespace before it: the tokens' bytes no longer add up to the
    text, so such a prompt is not kept, nor split at that token."""
    backend = HFTokenizer.from_str(default_tokenizer.backend.to_str())
    backend.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tokenizer = replace(default_tokenizer, backend=backend)
    encoder = PromptEncoder(tokenizer)
    texts = ["<|im_start|>a" + "y " * 50 + "   <mask> b", "<|im_start|>a" + "y " * 50 + "   <mask> c"]
    for text in texts:
        assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.reused == 0


def test_a_tokenizer_that_drops_bytes_encodes_whole():
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "hello": 2, "world": 3}
    backend = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<|im_start|>"])
    tokenizer = Tokenizer(backend)
    encoder = PromptEncoder(tokenizer)
    text = "<|im_start|>" + "hello world " * 20
    for suffix in ("", " hello", " world world"):
        assert encoder.encode(text + suffix) == tokenizer.encode(text + suffix, add_special_tokens=False)
    assert encoder.reused == 0


def test_a_servers_next_turn_reuses_the_last_turns_tokens():
    """Over the routes: the second turn of a conversation counts the same prompt tokens as a fresh encoding
    of its text, most of them reused."""
    with RunningServer(AsyncLLM(max_concurrency=1, max_context=4096)) as s:
        system = {"role": "system", "content": "You are a careful assistant. " * 200}
        turns = [system, {"role": "user", "content": "What is 2 + 2?"}]
        first = httpx.post(
            f"{s.url}/v1/chat/completions", json={"messages": turns, "max_tokens": 4}, timeout=60
        )
        turns += [first.json()["choices"][0]["message"], {"role": "user", "content": "And 3 + 3?"}]
        second = httpx.post(
            f"{s.url}/v1/chat/completions", json={"messages": turns, "max_tokens": 4}, timeout=60
        )
        text = s.state.render_text([{"role": m["role"], "content": m["content"]} for m in turns], None, {})
        fresh = s.engine.tokenizer.encode(text, add_special_tokens=False)
        assert second.json()["usage"]["prompt_tokens"] == len(fresh)
        assert s.state.prompt_encoder.reused > 1000


@pytest.mark.parametrize("route", ["/completion", "/v1/completions", "/api/generate"])
def test_a_raw_prompt_resent_longer_reuses_its_tokens(route):
    """A client that writes the ChatML prompt itself and resends it grown each turn (llama-server's
    /completion, text completions, Ollama's raw generate) has the last one's tokens reused too; the ids are
    the tokenizer's own (the embedded model's tokenizer adds no tokens of its own)."""
    engine = ScriptedEngine(["ok", "ok"])
    turn = (
        "<|im_start|>user\n" + "Explain the code in server.py. " * 200 + "<|im_end|>\n<|im_start|>assistant\n"
    )
    first = turn + "It routes requests.<|im_end|>\n"
    second = first + "<|im_start|>user\nAnd the tests?<|im_end|>\n<|im_start|>assistant\n"
    with RunningServer(engine) as s:
        for prompt in (first, second):
            body = {"model": "m", "prompt": prompt, "stream": False, "raw": True}
            assert httpx.post(f"{s.url}{route}", json=body, timeout=60).status_code == 200
        assert engine.prompt_ids[1] == engine.tokenizer.encode(second)
        assert s.state.prompt_encoder.reused > 1000


def test_a_tokenizer_that_adds_a_bos_encodes_raw_prompts_itself():
    """Where the tokenizer adds a token of its own (a BOS), a raw prompt's ids keep it: the tokenizer's."""
    engine = ScriptedEngine(["ok"])
    bos = engine.tokenizer.token_to_id("<|im_start|>")
    engine.tokenizer = replace(engine.tokenizer, bos_token="<|im_start|>", add_bos_token=True)
    with RunningServer(engine) as s:
        body = {"prompt": "Hello there", "n_predict": 2}
        assert httpx.post(f"{s.url}/completion", json=body, timeout=60).status_code == 200
        assert engine.prompt_ids[0][0] == bos
        assert engine.prompt_ids[0] == engine.tokenizer.encode("Hello there")
