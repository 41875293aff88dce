"""The races a drafter drafts with (engine/sample/race.py): per drafting request, the race keys of the
positions its drafts will take and its race parameters (temperature and truncations), from the sampler
(`Sampler.draft_race`), and, for a request with penalties or DRY, what they do to each token's logit
(`penalty_terms`), staged on the device once a drafting pass. A greedy request races nothing (it drafts its
argmax, penalized where it has penalties), and a pass with none but plain greedy requests stages nothing."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.request import SamplingParams
from engine.sample.penalties import penalize
from engine.sample.race import NOT_RACED, race_pick
from engine.scheduler.output import SampledToken
from engine.transfer import to_device

# (request id, its sampling parameters, position of its first draft, drafts) -> (race parameters, keys)
RaceSource = Callable[[str, SamplingParams, int, int], tuple[tuple[float, ...], list[int]]]
# one chained step's race: (keys [n] int64, race parameters [n, 4] fp32, the penalties' factors [n, V] and
# subtrahends [n, V] fp32 or both None), or None: every row plain greedy
Race = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None


def penalty_terms(
    requests, emitted: list[list[int]], vocab: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the sampler's penalties and DRY do to each token's logit for each of `requests` (scheduled
    requests; `emitted`: the tokens each emitted this step, after its history), as the factor r and the
    subtrahend b of l -> (l / r where l > 0, else l * r) - b: [C, vocab] fp32 each (1 and 0 for a request
    without them). Read off the sampler's own `penalize` on rows of 0 and of 1, so the drafter penalizes
    exactly as the sampler does (the drafts a chain makes before a position are not counted)."""
    n = len(requests)
    probe = torch.zeros(2 * n, vocab, device=device)
    probe[1::2] = 1.0
    params, histories = [], []
    for r, tokens in zip(requests, emitted):
        history = r.history
        if history is not None:
            history = history._replace(output_ids=[*history.output_ids, *tokens])
        params += [r.sampling_params] * 2
        histories += [history] * 2
    out = penalize(probe, params, histories)
    zero, one = out[0::2], out[1::2]  # -b, 1 / r - b
    return 1.0 / (one - zero), -zero


class DraftRaces:
    def __init__(self, keys=None, params=None, scale=None, bias=None):
        # [C, k] int64, [C, 4] fp32, [C, V] fp32 (or None: no penalties), [C, V] fp32; or all None
        self.keys, self.params, self.scale, self.bias = keys, params, scale, bias

    @classmethod
    def of(
        cls,
        source: RaceSource | None,
        requests,
        first_positions: list[int],
        count: int,
        device,
        vocab: int,
        sampled: dict[str, list[SampledToken]],
    ) -> DraftRaces:
        """The races of `requests` (scheduled requests, each drafting `count` tokens from its first
        position, after the tokens `sampled` holds for it); none when no source is set or every request is
        greedy without penalties."""
        if source is None:
            return cls()
        races = [source(r.request_id, r.sampling_params, p, count) for r, p in zip(requests, first_positions)]
        penalized = any(r.sampling_params.needs_history for r in requests)
        if not penalized and all(race == NOT_RACED for race, _ in races):
            return cls()
        keys = to_device([k for _, k in races], torch.int64, device)  # [C, k]
        params = to_device([race for race, _ in races], torch.float32, device)  # [C, 4]
        if not penalized:
            return cls(keys, params)
        emitted = [[t.token_id for t in sampled.get(r.request_id, ())] for r in requests]
        return cls(keys, params, *penalty_terms(requests, emitted, vocab, device))

    def step(self, step: int) -> Race:
        """The race of every chain's draft number `step` (counted from 0)."""
        if self.keys is None:
            return None
        return self.keys[:, step].contiguous(), self.params, self.scale, self.bias

    def keep(self, rows: torch.Tensor) -> DraftRaces:
        """Only the chains at `rows` [n] int64 (those still drafting)."""
        if self.keys is None:
            return self
        terms = (None, None) if self.scale is None else (self.scale[rows], self.bias[rows])
        return DraftRaces(self.keys[rows], self.params[rows], *terms)


def pick(logits: torch.Tensor, race: Race) -> torch.Tensor:
    """The drafts [n] from draft logits [n, V]: raced for sampled rows (penalized where they have penalties),
    argmax without a race."""
    return logits.argmax(-1) if race is None else race_pick(logits, *race)
