"""llama.cpp's limits on generated code for editor completion: `n_indent` (a line indented less than this
many columns ends the reply before it: the gap's block is over) and `t_max_predict_ms` (past this long
since the first token, the reply ends once it holds a newline)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InfillLimits:
    n_indent: int = 0
    t_max_predict_ms: int = 0

    def cut_at(self, text: str) -> int | None:
        """Where the text ends under `n_indent`: the start of the first line, after the first, that is
        indented less; None while none is."""
        if self.n_indent <= 0:
            return None
        start = text.find("\n") + 1
        while start > 0:
            line_end = text.find("\n", start)
            line = (text[start:] if line_end < 0 else text[start:line_end]).rstrip("\r")  # CRLF files too
            body = line.lstrip(" \t")
            if body and len(line) - len(body) < self.n_indent:
                return start
            start = line_end + 1
        return None

    def sendable(self, text: str) -> int:
        """How much of the text can be sent: under `n_indent`, a last line with no text yet is held
        until its indentation is known."""
        if self.n_indent <= 0:
            return len(text)
        start = text.rfind("\n") + 1
        return start if start > 0 and not text[start:].strip(" \t\r") else len(text)

    def out_of_time(self, text: str, predicting_ms: float) -> bool:
        return 0 < self.t_max_predict_ms < predicting_ms and "\n" in text
