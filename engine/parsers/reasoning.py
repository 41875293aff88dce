"""Split a Qwen-style `<think>…</think>` reasoning section from the answer, also while streaming."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ReasoningSplitter:
    """Feed text deltas; get (reasoning delta, content delta) back. A tag cut across deltas is held until
    it is complete, so no partial tag leaks into either stream.

    `starts_in_reasoning`: the prompt already opened `<think>` (templates with thinking on do this).
    """

    def __init__(self, starts_in_reasoning: bool = False):
        self.in_reasoning = starts_in_reasoning
        self.seen_open = starts_in_reasoning
        self.pending = ""
        self.strip_newlines = False  # the newlines right after </think> belong to neither stream

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        text = self.pending + delta
        self.pending = ""
        reasoning, content = [], []
        while text:
            tag = CLOSE if self.in_reasoning else OPEN
            at = text.find(tag)
            if at >= 0 and (self.in_reasoning or not self.seen_open):
                (reasoning if self.in_reasoning else content).append(text[:at])
                text = text[at + len(tag) :]
                if self.in_reasoning:
                    self.in_reasoning, self.strip_newlines = False, True
                else:
                    self.in_reasoning = self.seen_open = True
                continue
            keep = 0 if final else _partial_suffix(text, tag)
            out, self.pending = text[: len(text) - keep], text[len(text) - keep :]
            (reasoning if self.in_reasoning else content).append(out)
            break
        answer = "".join(content)
        if self.strip_newlines and not self.in_reasoning:
            answer = answer.lstrip("\n")
            self.strip_newlines = not answer
        return "".join(reasoning), answer


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_reasoning(text: str, starts_in_reasoning: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a whole reply."""
    return ReasoningSplitter(starts_in_reasoning).feed(text, final=True)
