"""Per-request detokenization and stop strings, between the scheduler and the caller."""

from __future__ import annotations

from engine.request import Request, RequestOutput
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


class RequestStream:
    """Accumulates one request's text; withholds a tail that could still become a stop string."""

    def __init__(self, request: Request, tokenizer: Tokenizer | None, prompt: str | None):
        self.request, self.prompt = request, prompt
        params = request.sampling_params
        self.detok = IncrementalDetokenizer(tokenizer, params.skip_special_tokens) if tokenizer else None
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        # a token that ends the request (EOS unless ignored, a stop token id) adds no text, as in vLLM: an
        # infill's <|file_sep|> or a caller's stop token that is plain text stays out of the reply
        self.end_ids = set(params.stop_token_ids) | (
            set() if params.ignore_eos else set(request.eos_token_ids)
        )
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.min_tokens = params.min_tokens
        self.num_pushed = 0
        self.free_until = 0  # a stop string must end past this much text: that of the first min_tokens - 1
        self.text = ""
        self.emitted = 0
        self.stopped = False
        self.matched_stop: str | None = None
        self.progress_said = 0  # return_progress: the most prompt tokens an output has said were processed

    def push(self, token_id: int) -> None:
        """Detokenize one new token; sets `stopped` when a stop string appears (text cut before it, or after
        it with include_stop_str_in_output)."""
        if self.detok is None or self.stopped:
            return
        self.num_pushed += 1
        if token_id in self.end_ids:
            return
        self._add(self.detok.push(token_id))

    def flush(self) -> None:
        """At the end of the output: the text the detokenizer held back (bytes of a character no token
        completed, as U+FFFD), unless a stop string ended the text."""
        if self.detok is not None and not self.stopped:
            self._add(self.detok.flush())

    def _add(self, delta: str) -> None:
        if not delta:
            return
        search_from = max(0, len(self.text) - self.holdback)
        self.text += delta
        if self.num_pushed < self.min_tokens:  # min_tokens: no stop string ends the output yet
            self.free_until = len(self.text)
            return
        found = [
            (at, s)
            for s in self.stop
            if (at := self.text.find(s, max(search_from, self.free_until - len(s) + 1))) >= 0
        ]
        if found:  # the earliest; the text ends before it, or with it (include_stop_str_in_output)
            at, s = min(found)
            self.text = self.text[: at + len(s) if self.include_stop else at]
            self.stopped, self.matched_stop = True, s

    def take_delta(self, finished: bool) -> str:
        end = (
            len(self.text) if finished or self.stopped else max(self.emitted, len(self.text) - self.holdback)
        )
        delta, self.emitted = self.text[self.emitted : end], end
        return delta

    def output(self, finish_reason: str | None) -> RequestOutput:
        req = self.request
        return RequestOutput(
            request_id=req.request_id,
            prompt=self.prompt,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=list(req.output_token_ids),
            text=self.text,
            logprobs=list(req.output_logprobs) if req.sampling_params.logprobs is not None else None,
            finish_reason=finish_reason,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            error=req.error,
            stop_string=self.matched_stop,
            num_draft_tokens=req.num_draft_tokens,
            num_accepted_tokens=req.num_accepted_tokens,
            num_prediction_tokens=req.num_prediction_tokens,
            num_accepted_prediction_tokens=req.num_accepted_prediction_tokens,
            prompt_logprobs=[None, *req.prompt_logprobs]
            if req.sampling_params.prompt_logprobs is not None
            else None,
            embedding=req.embedding,
            queue_time=req.admitted_at - req.arrival_time if req.admitted_at is not None else None,
        )
