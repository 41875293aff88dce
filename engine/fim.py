"""Fill-in-the-middle: the control tokens a code model was trained with, and the infill prompt built from
them (placed by token id; the code around them is encoded as text).

The layout is prefix-suffix-middle (PSM), as Qwen2.5-Coder / Qwen3-Coder and StarCoder write it:

    <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>{middle}

With other files of the project as context (llama.cpp's `input_extra`) and a model that has repository
tokens, the repository-level layout comes first:

    <repo_name>{repo}\\n<file_sep>{filename}\\n{text}...<file_sep>{current filename}\\n<fim_prefix>...

(a model without them gets the files' text in front of <fim_prefix>). The model writes the middle and
ends it with end-of-text, or with a FIM / file token: those end an infill request.

Too long for its budget, a prompt loses the extra files first (the earliest first), then the prefix's
start and the suffix's end (3 : 1, nearest the gap kept): `InfillPrompt.truncated` says it happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import NinferError
from engine.tokenizer import Tokenizer

# (prefix, suffix, middle, pad, repository name, file separator) as each model family spells them
_SPELLINGS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<repo_name>", "<file_sep>"),
)
_END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    pad: int | None
    repo_name: int | None
    file_sep: int | None
    end_of_text: int | None

    @property
    def repo_level(self) -> bool:
        """Whether the model has the tokens of the repository-level layout."""
        return self.repo_name is not None and self.file_sep is not None

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end the middle: a model writing one of them has left the gap."""
        ids = (
            self.prefix,
            self.suffix,
            self.middle,
            self.pad,
            self.repo_name,
            self.file_sep,
            self.end_of_text,
        )
        return tuple(i for i in ids if i is not None)


def fim_tokens(tokenizer: Tokenizer | None) -> FimTokens | None:
    """The model's FIM tokens; None when its vocabulary has no prefix / suffix / middle set."""
    if tokenizer is None:
        return None
    for spelling in _SPELLINGS:
        pre, suf, mid, pad, repo, sep = (tokenizer.token_to_id(t) for t in spelling)
        if pre is not None and suf is not None and mid is not None:
            return FimTokens(pre, suf, mid, pad, repo, sep, tokenizer.token_to_id(_END_OF_TEXT))
    return None


def no_fim_message(tokenizer: Tokenizer | None) -> str:
    spelled = " / ".join(s[0] for s in _SPELLINGS)
    what = "has no tokenizer" if tokenizer is None else f"has no fill-in-the-middle tokens ({spelled})"
    return (
        f"this model {what}; infill needs a code model trained for it, such as Qwen2.5-Coder or Qwen3-Coder"
    )


@dataclass(frozen=True)
class ExtraFile:
    """Another file of the project, given as context (llama.cpp's input_extra chunk)."""

    filename: str
    text: str


@dataclass(frozen=True)
class InfillPrompt:
    token_ids: list[int]
    truncated: bool  # extra files, the prefix's start or the suffix's end were left out to fit


REPO_NAME = "project"
FILENAME = "file"


def _line_ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def infill_prompt(
    tokenizer: Tokenizer,
    fim: FimTokens,
    prefix: str | list[int],
    suffix: str,
    budget: int | None = None,
    middle: str = "",
    extra: tuple[ExtraFile, ...] = (),
    filename: str | None = None,
) -> InfillPrompt:
    """The infill prompt's token ids, at most `budget` of them (None: all, uncut). `prefix`: text, or token
    ids as they are;
    `middle`: text the middle starts with (after <fim_middle>); `filename`: the current file's
    (repository-level layout only)."""

    def enc(text: str | list[int]) -> list[int]:
        if isinstance(text, list):
            return list(text)
        return tokenizer.encode(text, add_special_tokens=False) if text else []

    bos = tokenizer.token_to_id(tokenizer.bos_token) if tokenizer.add_bos_token else None
    head = [] if bos is None else [bos]
    files: list[list[int]] = []
    repo_level = fim.repo_level and (bool(extra) or filename is not None)
    if repo_level:
        head += [fim.repo_name, *enc(f"{REPO_NAME}\n")]
        # each file's text ends with a newline before the next separator, as the model was trained
        files = [[fim.file_sep, *enc(f"{f.filename}\n{_line_ended(f.text)}")] for f in extra]
        current = [fim.file_sep, *enc(f"{filename or FILENAME}\n")]
    else:
        files = [enc(_line_ended(f.text)) for f in extra]
        current = []
    pre, suf, mid = enc(prefix), enc(suffix), enc(middle)
    fixed = len(head) + len(current) + 3 + len(mid)
    if budget is None:  # room for everything: nothing is cut
        budget = fixed + sum(map(len, files)) + len(pre) + len(suf)
    if fixed > budget:
        raise NinferError(
            f"the infill prompt needs {fixed} tokens before any code, but only {budget} fit; "
            "send a shorter 'prompt', fewer tokens to predict, or raise --max-context"
        )
    room = budget - fixed
    files_len, first = sum(map(len, files)), 0
    while first < len(files) and files_len + len(pre) + len(suf) > room:  # the earliest files go first
        files_len -= len(files[first])
        first += 1
    truncated = first > 0
    files = files[first:]
    room -= files_len
    if len(pre) + len(suf) > room:
        truncated = True
        keep_suf = min(len(suf), max(room // 4, room - len(pre)))
        keep_pre = room - keep_suf
        pre, suf = pre[len(pre) - keep_pre :], suf[:keep_suf]
    ids = [
        *head,
        *(t for f in files for t in f),
        *current,
        fim.prefix,
        *pre,
        fim.suffix,
        *suf,
        fim.middle,
        *mid,
    ]
    return InfillPrompt(ids, truncated)
