"""Fill-in-the-middle prompts (engine/fim.py): the model's FIM tokens found by their spelling, the PSM and
repository-level layouts, and the cuts that fit a prompt to its budget."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from engine.errors import NinferError
from engine.fim import ExtraFile, fim_tokens, infill_prompt, no_fim_message
from engine.tokenizer import Tokenizer


def _with_tokens(base: Tokenizer, tokens: list[str]) -> Tokenizer:
    backend = HFTokenizer.from_str(base.backend.to_str())
    backend.add_tokens([AddedToken(t, special=False) for t in tokens])
    return Tokenizer(backend=backend, eos_token=base.eos_token)


def _text(tok: Tokenizer, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_the_tokens_are_found_by_each_familys_spelling(fim_tokenizer, default_tokenizer):
    fim = fim_tokens(fim_tokenizer)
    assert fim is not None and fim.repo_level
    assert [fim.prefix, fim.suffix, fim.middle] == [
        fim_tokenizer.token_to_id(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    ]
    # the middle ends at end-of-text, padding, a file or repository token, or another FIM token
    assert set(fim.stop_token_ids) == {
        fim_tokenizer.token_to_id(t)
        for t in (
            "<|fim_prefix|>",
            "<|fim_suffix|>",
            "<|fim_middle|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<|endoftext|>",
        )
    }
    starcoder = fim_tokens(_with_tokens(default_tokenizer, ["<fim_prefix>", "<fim_middle>", "<fim_suffix>"]))
    # (SmolLM2's vocabulary already holds StarCoder's <repo_name> and <file_sep>)
    assert starcoder is not None and starcoder.repo_level and starcoder.pad is None
    assert starcoder.prefix == 49152 and starcoder.file_sep == default_tokenizer.token_to_id("<file_sep>")
    # the embedded SmolLM2 has none: the refusal names what infill needs
    assert fim_tokens(default_tokenizer) is None and fim_tokens(None) is None
    assert "no fill-in-the-middle tokens" in no_fim_message(default_tokenizer)
    assert "Qwen2.5-Coder" in no_fim_message(default_tokenizer)


def test_the_prefix_suffix_middle_layout(fim_tokenizer):
    fim = fim_tokens(fim_tokenizer)
    built = infill_prompt(fim_tokenizer, fim, "def area(r):\n    ", "\n    return a\n", budget=1000)
    assert not built.truncated
    assert _text(fim_tokenizer, built.token_ids) == (
        "<|fim_prefix|>def area(r):\n    <|fim_suffix|>\n    return a\n<|fim_middle|>"
    )
    assert built.token_ids[0] == fim.prefix and built.token_ids[-1] == fim.middle
    # text the middle starts with comes after the middle token; a prefix given as token ids is kept as is
    ids = fim_tokenizer.encode("x = ", add_special_tokens=False)
    started = infill_prompt(fim_tokenizer, fim, ids, "", budget=1000, middle="3.14")
    assert _text(fim_tokenizer, started.token_ids) == "<|fim_prefix|>x = <|fim_suffix|><|fim_middle|>3.14"
    assert started.token_ids[1 : 1 + len(ids)] == ids


def test_other_files_take_the_repository_layout(fim_tokenizer, default_tokenizer):
    fim = fim_tokens(fim_tokenizer)
    extra = (ExtraFile("util.py", "def pi():\n    return 3.14"), ExtraFile("a.py", "import util\n"))
    built = infill_prompt(fim_tokenizer, fim, "r = ", "\n", budget=1000, extra=extra, filename="main.py")
    assert _text(fim_tokenizer, built.token_ids) == (
        "<|repo_name|>project\n<|file_sep|>util.py\ndef pi():\n    return 3.14\n<|file_sep|>a.py\nimport util\n"
        "<|file_sep|>main.py\n<|fim_prefix|>r = <|fim_suffix|>\n<|fim_middle|>"
    )
    # a model without repository tokens reads the files' text in front of the prefix token
    plain_tok = _with_tokens(default_tokenizer, ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"])
    plain = infill_prompt(plain_tok, fim_tokens(plain_tok), "r = ", "", budget=1000, extra=extra)
    assert _text(plain_tok, plain.token_ids) == (
        "def pi():\n    return 3.14\nimport util\n<|fim_prefix|>r = <|fim_suffix|><|fim_middle|>"
    )


def test_a_bos_is_written_where_the_tokenizer_adds_one(fim_tokenizer):
    tok = replace(fim_tokenizer, bos_token="<|im_start|>", add_bos_token=True)
    ids = infill_prompt(tok, fim_tokens(tok), "a", "b", budget=100).token_ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[1] == fim_tokens(tok).prefix


def _words(n: int, stem: str) -> str:
    return " ".join(f"{stem}{i}" for i in range(n))


@pytest.mark.parametrize("budget", [60, 100, 140])
def test_a_long_prompt_loses_the_files_first_then_the_far_ends_of_the_code(fim_tokenizer, budget):
    fim = fim_tokens(fim_tokenizer)
    prefix, suffix = _words(40, "p"), _words(40, "s")
    extra = (ExtraFile("old.py", _words(30, "o")), ExtraFile("new.py", _words(10, "n")))
    full = infill_prompt(fim_tokenizer, fim, prefix, suffix, budget=10_000, extra=extra, filename="f.py")
    assert not full.truncated and len(full.token_ids) > budget
    cut = infill_prompt(fim_tokenizer, fim, prefix, suffix, budget=budget, extra=extra, filename="f.py")
    assert cut.truncated and len(cut.token_ids) <= budget
    text = _text(fim_tokenizer, cut.token_ids)
    assert "old.py" not in text  # the earliest file goes first
    before, rest = text.split("<|fim_prefix|>")[1].split("<|fim_suffix|>")
    after = rest.split("<|fim_middle|>")[0]
    # the code nearest the gap is kept: the prefix's end and the suffix's start
    assert prefix.endswith(before) and suffix.startswith(after) and before and after
    n_before = len(fim_tokenizer.encode(before, add_special_tokens=False))
    n_after = len(fim_tokenizer.encode(after, add_special_tokens=False))
    if "new.py" not in text:  # everything left went to the code: 3 : 1
        assert n_before >= 3 * n_after - 3
    # a short suffix is kept whole and the prefix takes the rest
    short = infill_prompt(fim_tokenizer, fim, prefix, "end", budget=budget)
    whole = infill_prompt(fim_tokenizer, fim, prefix, "end", budget=10_000)
    short_text = _text(fim_tokenizer, short.token_ids)
    assert short_text.endswith("<|fim_suffix|>end<|fim_middle|>")
    assert len(short.token_ids) == min(budget, len(whole.token_ids))


def test_a_budget_below_the_layout_is_refused(fim_tokenizer):
    fim = fim_tokens(fim_tokenizer)
    with pytest.raises(
        NinferError, match="the infill prompt needs .* tokens before any code, but only 4 fit"
    ):
        infill_prompt(fim_tokenizer, fim, "x", "y", budget=4, middle="a long start of the middle")
