"""How logprobs name a token: its text (the token decoded alone), or `token_id:N` where the request asks
for vLLM's `return_tokens_as_token_ids` (a token that is part of a character is then still told apart);
and, on chat completions, its raw bytes (OpenAI's `bytes`, engine/token_bytes.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.api.common import field
from engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenNames:
    tokenizer: Tokenizer
    as_ids: bool = False

    def piece(self, token_id: int) -> str:
        """The token's text (what it adds to the reply)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def name(self, token_id: int, piece: str | None = None) -> str:
        """How the token is named; `piece`: its text, where the caller has it already."""
        if self.as_ids:
            return f"token_id:{token_id}"
        return self.piece(token_id) if piece is None else piece

    def bytes(self, token_id: int) -> list[int]:
        return list(self.tokenizer.token_bytes(token_id))

    def entry(self, token_id: int, logprob: float) -> dict:
        """OpenAI's logprob entry of a token: its name, logprob and bytes."""
        return {"token": self.name(token_id), "logprob": logprob, "bytes": self.bytes(token_id)}


def token_names(state, body: dict) -> TokenNames:
    return TokenNames(state.engine.tokenizer, field(body, "return_tokens_as_token_ids", bool, False))
