"""The races a drafter drafts with (engine/sample/race.py): per drafting request, the race keys of the
positions its drafts will take and its race parameters (temperature and truncations), from the sampler
(`Sampler.draft_race`), staged on the device once a drafting pass; a greedy request races nothing (it drafts
its argmax), and a pass with none but greedy requests stages nothing."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.request import SamplingParams
from engine.sample.race import NOT_RACED, race_pick
from engine.transfer import to_device

# (request id, its sampling parameters, position of its first draft, drafts) -> (race parameters, keys)
RaceSource = Callable[[str, SamplingParams, int, int], tuple[tuple[float, ...], list[int]]]
# one chained step's race: (keys [n] int64, race parameters [n, 4] fp32), or None: every row greedy
Race = tuple[torch.Tensor, torch.Tensor] | None


class DraftRaces:
    def __init__(self, keys: torch.Tensor | None, params: torch.Tensor | None):
        self.keys, self.params = keys, params  # [C, k] int64, [C, 4] fp32; or None

    @classmethod
    def of(
        cls, source: RaceSource | None, requests, first_positions: list[int], count: int, device
    ) -> DraftRaces:
        """The races of `requests` (scheduled requests, each drafting `count` tokens from its first
        position); none when no source is set or every request is greedy."""
        if source is None:
            return cls(None, None)
        races = [source(r.request_id, r.sampling_params, p, count) for r, p in zip(requests, first_positions)]
        if all(race == NOT_RACED for race, _ in races):
            return cls(None, None)
        keys = to_device([k for _, k in races], torch.int64, device)  # [C, k]
        return cls(keys, to_device([race for race, _ in races], torch.float32, device))

    def step(self, step: int) -> Race:
        """The race of every chain's draft number `step` (counted from 0)."""
        return None if self.keys is None else (self.keys[:, step].contiguous(), self.params)

    def keep(self, rows: torch.Tensor) -> DraftRaces:
        """Only the chains at `rows` [n] int64 (those still drafting)."""
        return self if self.keys is None else DraftRaces(self.keys[rows], self.params[rows])


def pick(logits: torch.Tensor, race: Race) -> torch.Tensor:
    """The drafts [n] from draft logits [n, V]: raced for sampled rows, argmax without a race."""
    return logits.argmax(-1) if race is None else race_pick(logits, *race)
