"""The Responses API's `message.output_text.logprobs` (asked for with `include`; `top_logprobs` 0..20
alternatives a token): the logprobs of the tokens that make the message's text, not those of its
reasoning or of its tool calls. The output tokens' text goes through a reply parser of its own, token by
token, and each token is placed against the text pieces the parser gives (MessageLogprobs)."""

from __future__ import annotations

from typing import Any

from engine.api.common import field, top_alternatives
from engine.api.errors import ApiError
from engine.api.token_names import TokenNames
from engine.parsers.reply import ReplyParser
from engine.parsers.tool_calls import CLOSE as CALL_CLOSE
from engine.request import RequestOutput, SamplingParams
from engine.tokenizer import IncrementalDetokenizer

LOGPROBS_INCLUDE = "message.output_text.logprobs"


def logprobs_setting(body: dict) -> int | None:
    """The alternatives a token the request asks for (0..20), or None where `include` leaves the message's
    logprobs out (OpenAI then answers an empty list, whatever `top_logprobs` says)."""
    include = field(body, "include", list, [])
    if not all(isinstance(name, str) for name in include):
        raise ApiError(400, "'include' must be an array of strings", "include")
    top = field(body, "top_logprobs", int, 0)
    if not 0 <= top <= 20:
        raise ApiError(400, f"'top_logprobs' must be between 0 and 20 (got {top})", "top_logprobs")
    return top if LOGPROBS_INCLUDE in include else None


class MessageLogprobs:
    """feed(out) -> the logprob entries of the message tokens newly told apart, in order; `groups`: all of
    them so far, one list for each text part of the reply (a call between two parts starts the next, as
    reply_parts and the streamed items part them). The reply parser gives its text pieces verbatim (it
    drops tags, the newlines after </think> and tool calls): each is found in the raw text from where the
    previous piece ended, and a token whose characters overlap a text piece is the message's. Calls are
    parsed as a stream parses them (a call cut short is a call, not text)."""

    def __init__(
        self,
        names: TokenNames,
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        in_reasoning: bool,
        tools: list[dict[str, Any]] | None,
        max_calls: int | None,
    ):
        self.names, self.top = names, params.logprobs or 0
        self.detok = IncrementalDetokenizer(names.tokenizer, params.skip_special_tokens)
        self.parser = ReplyParser(in_reasoning, tools, max_calls, stream_calls=True)
        # a token that ends the reply adds no text (engine/output_processor.py)
        self.end_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self.raw = ""  # the reply's text as fed
        self.spans: list[tuple[int, int, int]] = []  # (output position, first char, end char) of tokens
        self.cursor = 0  # raw text up to here is matched to the parser's pieces
        self.seen = 0  # output positions fed
        self.next_span = 0  # spans before this one are told apart
        self.groups: list[list[dict[str, Any]]] = []  # entries by text part
        self._call_since_text = True  # the next text starts a part

    def feed(self, out: RequestOutput) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        count = len(out.logprobs or ())
        for i in range(self.seen, count):
            token, last = out.token_ids[i], out.finished and i == count - 1
            text = "" if token in self.end_ids else self.detok.push(token)
            if last:  # what the detokenizer held back ends the reply too (engine/output_processor.py)
                text += self.detok.flush()
            if token not in self.end_ids:
                self.spans.append((i, len(self.raw), len(self.raw) + len(text)))
                self.raw += text
            for start, end in self._text_ranges(self.parser.feed(text, last)):
                told = [self._entry(out, i) for i in self._tokens_over(start, end)]
                if self._call_since_text:
                    self.groups.append([])
                    self._call_since_text = False
                self.groups[-1] += told
                entries += told
        self.seen = count
        return entries

    def _text_ranges(self, pieces: list[tuple[str, Any]]) -> list[tuple[int, int]]:
        """The raw text's character ranges of the pieces that are message text."""
        ranges = []
        for kind, value in pieces:
            if kind in ("tool_call_start", "tool_call_args"):  # (arguments come re-written, not verbatim)
                continue
            if kind in ("tool_call", "tool_call_end"):  # its text ends at its closing tag, or the reply
                end = self.raw.find(CALL_CLOSE, self.cursor)
                self.cursor = end + len(CALL_CLOSE) if end >= 0 else len(self.raw)
                self._call_since_text = True
                continue
            at = self.raw.find(value, self.cursor)
            if at < 0:  # NOTE: the parser gives its pieces verbatim, in order
                continue
            self.cursor = at + len(value)
            if kind == "text":
                ranges.append((at, self.cursor))
        return ranges

    def _tokens_over(self, start: int, end: int) -> list[int]:
        """Output positions of the tokens not yet told apart whose text overlaps [start, end)."""
        positions = []
        while self.next_span < len(self.spans):
            position, first, stop = self.spans[self.next_span]
            if first >= end:
                break
            if stop > start:
                positions.append(position)
            self.next_span += 1
        return positions

    def _entry(self, out: RequestOutput, i: int) -> dict[str, Any]:
        token, logprobs = out.token_ids[i], out.logprobs[i]
        alternatives = [self.names.entry(t, v) for t, v in top_alternatives(logprobs, self.top)]
        return {**self.names.entry(token, logprobs.get(token, float("-inf"))), "top_logprobs": alternatives}
