"""Drafts from a prediction the client sent (OpenAI's Predicted Outputs): the output it expects, usually
the file being edited. Each step drafts the prediction's tokens after where the output stands in it.

The output is followed token by token through the prediction while it matches. Where it departs (an
edit), the place is found again from the output's last tokens: the longest suffix (up to `max_ngram`,
at least `min_ngram`) that occurs in the prediction, at its first occurrence at or after the last place
the output matched (an edit moves forward through a file), else its last occurrence before. Until then,
and after the prediction's end, the request drafts from the server's own method (n-gram, MTP head, draft
model). The verifier decides what is kept, as for any draft, so the output is what it would be without
the prediction; a wrong prediction costs only the compute of its positions.

How far a step drafts grows with the prediction's record: `base` tokens (the method's draft count) at
first and after any rejected draft, twice as many after a step that kept all of its drafts, up to `most`
(`num_prediction_tokens`). A reply that follows the prediction is soon verified `most` tokens a step; one
that keeps departing from it costs no more than the method's own drafts (where each position costs
compute, a CPU or a large batch, a long wrong guess is not free).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.request import Request


@dataclass
class _Place:
    prediction: np.ndarray  # [P] int64
    num_seen: int = 0  # output tokens followed so far
    cursor: int = 0  # index of the prediction's token expected next; -1 when the place is lost
    last_match: int = 0  # the cursor before the output departed from the prediction
    reach: int = 0  # how many tokens the next step may draft
    proposed: int = 0  # drafted at the last proposal (0: none since the output was last followed)


class PredictionDrafts:
    """Per request with a prediction, its place in it; proposals are the prediction's next tokens."""

    def __init__(self, base: int, most: int, max_ngram: int = 8, min_ngram: int = 2):
        assert 0 < min_ngram <= max_ngram and 0 < base <= most
        self.base, self.most = base, most
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._places: dict[str, _Place] = {}

    def forget(self, request_id: str) -> None:
        self._places.pop(request_id, None)

    def propose(self, req: Request, max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens of the request's prediction that follow its output; [] without a
        prediction, when the output's place in it is lost, or past its end."""
        if not req.sampling_params.prediction or max_tokens <= 0:
            return []
        place = self._follow(req)
        if place.cursor < 0:
            return []
        drafts = place.prediction[place.cursor : place.cursor + min(max_tokens, place.reach)].tolist()
        place.proposed = len(drafts)
        return drafts

    def _follow(self, req: Request) -> _Place:
        place = self._places.get(req.request_id)
        output = req.output_token_ids
        if place is None or len(output) < place.num_seen:  # new, or the output was cut (a stop string)
            place = _Place(np.asarray(req.sampling_params.prediction, dtype=np.int64), reach=self.base)
            self._places[req.request_id] = place
        prediction, size = place.prediction, len(place.prediction)
        followed = 0  # new output tokens that went on along the prediction
        for token in output[place.num_seen :]:
            if 0 <= place.cursor < size and prediction[place.cursor] == token:
                place.cursor += 1
                followed += 1
            elif place.cursor >= 0:
                place.last_match, place.cursor = place.cursor, -1
        place.num_seen = len(output)
        if place.proposed:  # the last proposal's drafts all kept: reach further; else start again
            place.reach = min(self.most, 2 * place.reach) if followed >= place.proposed else self.base
            place.proposed = 0
        if place.cursor < 0:
            place.cursor = self._find(prediction, output, place.last_match)
            if place.cursor >= 0:
                place.last_match = place.cursor
        return place

    def _find(self, prediction: np.ndarray, output: list[int], after: int) -> int:
        """The prediction index after the longest suffix of `output` found in it (see the module's
        docstring for which occurrence); -1 when none of at least `min_ngram` tokens occurs. One scan of the
        prediction for the last token, then its matches extended backwards a token at a time."""
        m = len(output)
        longest = min(self.max_ngram, m)
        if longest < self.min_ngram:
            return -1
        ends = np.flatnonzero(prediction == output[-1]) + 1  # where a 1-token match ends (exclusive)
        found = ends if self.min_ngram == 1 and len(ends) else None
        for length in range(2, longest + 1):
            ends = ends[ends >= length]
            ends = ends[prediction[ends - length] == output[m - length]]
            if not len(ends):
                break
            if length >= self.min_ngram:
                found = ends
        if found is None:
            return -1
        ahead = found[found >= after]
        return int(ahead[0]) if len(ahead) else int(found[-1])
