"""vLLM's `return_token_ids` on chat completions and completions: the prompt's token ids beside the reply
(`prompt_token_ids`) and each choice's (`token_ids`), as training and evaluation loops that score the
exact tokens want them. Streamed, the prompt's come with the first chunk (of each choice, on completions)
and each chunk carries the tokens that came since the choice's last one, so that they add up."""

from __future__ import annotations

from engine.api.common import field
from engine.request import RequestOutput


def asked(body: dict) -> bool:
    return field(body, "return_token_ids", bool, False)


class TokenIds:
    """The token ids a stream's choices have sent, for return_token_ids (off: every call gives None)."""

    def __init__(self, on: bool, choices: int):
        self.on = on
        self._sent = [0] * choices
        self._latest: list[list[int]] = [[] for _ in range(choices)]

    def seen(self, index: int, out: RequestOutput) -> None:
        if self.on:
            self._latest[index] = out.token_ids

    def take(self, index: int) -> list[int] | None:
        """The choice's tokens not yet sent (marked sent), or None when not asked."""
        if not self.on:
            return None
        new = self._latest[index][self._sent[index] :]
        self._sent[index] = len(self._latest[index])
        return list(new)
