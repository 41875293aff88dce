"""vLLM's bad_words: the output never holds a banned word's tokens (as the text would start with it, or
after a space); a one-token word is banned from every row, a longer one's last token only where the tokens
before would complete it, drafts' rows included; the rest of the output is the model's greedy tokens."""

from __future__ import annotations

import pytest
from conftest import save_tiny_with_tokenizer
from test_spec_decode import ScriptedDrafts

from engine import LLM, NinferError, SamplingParams

GREEDY = dict(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory, default_tokenizer):
    return LLM(save_tiny_with_tokenizer(tmp_path_factory.mktemp("bad_words"), default_tokenizer))


@pytest.fixture(scope="module")
def prompt(default_tokenizer):
    return default_tokenizer.encode("The quick brown fox jumps over", add_special_tokens=False)


@pytest.fixture(scope="module")
def plain(llm, prompt):
    return llm.generate(None, SamplingParams(**GREEDY), [prompt])[0].token_ids


def _variants(tok, word: str) -> list[list[int]]:
    return [tok.encode(v, add_special_tokens=False) for v in (word.lstrip(), " " + word.lstrip())]


def _holds(ids: list[int], word_ids: list[int]) -> bool:
    n = len(word_ids)
    return any(ids[i : i + n] == word_ids for i in range(len(ids) - n + 1))


def _a_word(tok, plain: list[int], length: int) -> tuple[int, str]:
    """The first place the greedy output spells a word of `length` tokens exactly as one of its variants."""
    for i in range(1, len(plain) - length):
        word = tok.decode(plain[i : i + length]).strip()
        if (
            word
            and plain[i : i + length] in _variants(tok, word)
            and not _holds(plain[:i], plain[i : i + length])
        ):
            return i, word
    raise AssertionError("no such word in the greedy output")


@pytest.mark.parametrize("length", [1, 2])
def test_a_banned_word_never_comes_out(llm, prompt, plain, length):
    tok = llm.tokenizer
    i, word = _a_word(tok, plain, length)
    out = llm.generate(None, SamplingParams(**GREEDY, bad_words=[word]), [prompt])[0].token_ids
    assert not any(_holds(out, v) for v in _variants(tok, word))
    # before the word the output is the model's own; where it began, something else comes
    assert out[: i + length - 1] == plain[: i + length - 1] and out[i + length - 1] != plain[i + length - 1]


def test_drafts_of_a_banned_word_are_rejected_at_its_row(llm, prompt, plain):
    """Drafts of the unbanned continuation spell the word: the row that would complete it refuses it, and
    the output is what it is without drafts."""
    tok = llm.tokenizer
    _, word = _a_word(tok, plain, 2)
    params = SamplingParams(**GREEDY, bad_words=[word])
    want = llm.generate(None, params, [prompt])[0].token_ids
    drafted = LLM(llm.engine_config.model, spec="ngram", draft_tokens=4)
    drafted.scheduler.proposer = ScriptedDrafts({"req-0": prompt + plain}, 1000, 4)
    out = drafted.generate(None, params, [prompt])[0]
    assert out.token_ids == want and drafted.scheduler.num_accepted_tokens > 0


def test_bad_words_are_checked(llm, prompt):
    with pytest.raises(NinferError, match="bad_words must be a list of non-empty strings"):
        SamplingParams(bad_words=["ok", " "])
    with pytest.raises(NinferError, match="bad_words must be a list of non-empty strings"):
        SamplingParams(bad_words=[3])
