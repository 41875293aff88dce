"""Structured outputs in the engine: one grammar matcher per request, token masks for the sampler.

A request's grammar (engine/structured/grammars.py) is compiled against the model's tokenizer once, when
the request arrives. Each step that samples it, `fill_masks` writes the tokens the grammar allows, one
bit per vocabulary entry (llguidance's bitmask layout), for its known tokens and after each of its draft
tokens; the sampler sets every other logit to -inf; the scheduler feeds the emitted tokens back
(`consume`). A prompt that opens a `<think>` section (thinking on) is left free until `</think>`: the grammar
applies to the answer, as the reasoning parser splits it. A thinking budget uses the same masks: once the
reasoning has that many tokens, `</think>` is the only token allowed (a request with a budget and no grammar
gets a matcher too; its masks cost nothing until the budget is spent).
"""

from __future__ import annotations

import threading

import torch

from engine.errors import NinferError
from engine.structured.grammars import llguidance
from engine.tokenizer import Tokenizer


class GrammarMatcher:
    """What constrains one request's output: a grammar (llguidance's matcher), a thinking budget, or both.

    While the prompt's `<think>` section is open (`waiting_for` is `</think>`'s id), the reasoning is free, up
    to `thinking_budget` tokens: the row that would pass it allows `</think>` alone. Then the grammar, if
    any, holds the answer."""

    def __init__(self, matcher, num_words: int, waiting_for: int | None, thinking_budget: int | None = None):
        self._matcher = matcher  # llguidance.LLMatcher, or None for a thinking budget alone
        self.num_words = num_words  # int32 words of one mask row: ceil(vocab / 32)
        self.waiting_for = waiting_for  # the token that ends the reasoning; None once the grammar applies
        self.thinking_budget = thinking_budget
        self.num_thinking = 0  # reasoning tokens so far

    @property
    def done(self) -> bool:
        """The grammar is complete (only an end-of-sequence token may follow) or broken."""
        return self.waiting_for is None and self._matcher is not None and self._matcher.is_stopped()

    @property
    def error(self) -> str:
        """Why the output left the grammar ('' when it has not)."""
        return self._matcher.get_error() if self._matcher is not None else ""

    def consume(self, token_ids: list[int]) -> None:
        """Advance past emitted tokens (the masks only ever allow tokens the grammar takes)."""
        for t in token_ids:
            if self.waiting_for is not None:
                self.num_thinking += 1
                if t == self.waiting_for:
                    self.waiting_for = None
            elif self._matcher is not None and not self._matcher.consume_token(t):
                return

    def _budget_spent(self, k: int) -> bool:
        """Whether the reasoning's budget is spent at the k-th token from now (only `</think>` may come)."""
        return self.thinking_budget is not None and self.num_thinking + k >= self.thinking_budget

    def valid_prefix(self, draft_token_ids: list[int]) -> int:
        """How many of the drafts, in order, the constraints allow (a refused one would be rejected at its
        row, and every draft after it with it): drafts are cut there before they are run."""
        waiting = self.waiting_for
        for k, t in enumerate(draft_token_ids):
            if waiting is None:
                if self._matcher is None:
                    break
                return k + self._matcher.validate_tokens(list(draft_token_ids[k:]))
            if self._budget_spent(k) and t != waiting:
                return k
            if t == waiting:
                waiting = None
        return len(draft_token_ids)

    def fill_masks(self, bitmask: torch.Tensor, first_row: int, draft_token_ids: tuple[int, ...]) -> bool:
        """bitmask: [R, num_words] int32 on the host, all bits set. Rows first_row.. get the tokens allowed
        after the known tokens, then after each draft in turn. A draft the grammar refuses is masked out at
        its own row (so it is rejected); the rows after it are never used and stay as they are. Returns
        whether any row was written (a budget still far off writes none)."""
        waiting, consumed, wrote = self.waiting_for, 0, False
        for k in range(len(draft_token_ids) + 1):
            row = bitmask[first_row + k]
            if waiting is not None:
                if self._budget_spent(k):
                    row.zero_()  # the budget is spent: the reasoning ends here
                    row[waiting // 32] = _bit(waiting % 32)
                    wrote = True
            elif self._matcher is not None and not self._matcher.is_error():
                self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
                wrote = True
            if k == len(draft_token_ids):
                break
            draft = draft_token_ids[k]
            if waiting is not None:
                waiting = None if draft == waiting else waiting
            elif self._matcher is None:
                break  # nothing constrains the rows after the reasoning
            elif self._matcher.try_consume_tokens([draft]) == 1:
                consumed += 1
            else:
                break
        if consumed:
            self._matcher.rollback(consumed)
        return wrote


def _bit(i: int) -> int:
    """An int32 word with bit i set (bit 31 is the sign)."""
    return (1 << i) - (1 << 32) if i == 31 else 1 << i


class GrammarCompiler:
    """Compiles request grammars for one model's tokenizer (llguidance's tokenizer built on first use)."""

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.vocab_size = max(vocab_size, tokenizer.vocab_size if tokenizer else 0)
        self.eos_token_ids = eos_token_ids
        self._ll_tokenizer = None
        self._lock = threading.Lock()  # the server compiles on worker threads

    @property
    def num_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def matcher(
        self, grammar: str | None, prompt_token_ids: list[int], thinking_budget: int | None = None
    ) -> GrammarMatcher | None:
        """A matcher at the start of the output of `prompt_token_ids` (None when neither the grammar nor the
        budget applies: no grammar, and no open `<think>` to limit); NinferError for a grammar that does not
        compile (the message says where)."""
        if grammar is None and (thinking_budget is None or self.tokenizer is None):
            return None
        if self.tokenizer is None:
            raise NinferError("structured outputs need the model's tokenizer; this model has none")
        waiting_for = self._reasoning_end(prompt_token_ids)
        if grammar is None:
            return (
                GrammarMatcher(None, self.num_words, waiting_for, thinking_budget)
                if waiting_for is not None
                else None
            )
        llg = llguidance()
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llg.LLTokenizer(
                    self.tokenizer.backend.to_str(),
                    n_vocab=self.vocab_size,
                    eos_token=list(self.eos_token_ids),
                )
        # Lark text, or llguidance's top-level JSON (a tool call holding a custom tool's own grammar)
        top = grammar if grammar.startswith("{") else llg.LLMatcher.grammar_from_lark(grammar)
        matcher = llg.LLMatcher(self._ll_tokenizer, top, log_level=0)
        if matcher.is_error():
            reason = matcher.get_error().strip().splitlines()[0]
            raise NinferError(f"the output format does not compile into a grammar: {reason}")
        return GrammarMatcher(matcher, self.num_words, waiting_for, thinking_budget)

    def _reasoning_end(self, prompt_token_ids: list[int]) -> int | None:
        """`</think>`'s id when the prompt ends inside an open `<think>` section, else None."""
        tok = self.tokenizer
        open_id, end_id = tok.token_to_id("<think>"), tok.token_to_id("</think>")
        tail = prompt_token_ids[-8:]
        if open_id is None or end_id is None or open_id not in tail:
            return None
        after = tail[len(tail) - tail[::-1].index(open_id) :]
        return end_id if not tok.decode(after, skip_special_tokens=False).strip() else None


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [R, V] with -inf where bitmask [R, ceil(V / 32)] int32 (same device) has a 0 bit."""
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(1)[:, : logits.shape[1]]  # [R, V]
    return logits.masked_fill(allowed == 0, float("-inf"))
