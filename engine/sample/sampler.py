"""Token sampling: greedy or drawn (engine/sample/filters.py: temperature, top-k, top-p, ...), per-request
seeds, speculative drafts verified; penalties and DRY first (engine/sample/penalties.py); logprobs of the raw
distribution.

A drawn token's randomness is a function of the request's seed (a random one when it has none) and the
position the token takes, not of how many draws came before (engine/sample/race.py): a seeded request
samples the same tokens with drafts or without, however many of them were accepted, padded or cut for spare
pages, and when preempted and recomputed; and a drafter can race its own distribution against the noise a
draft's position will meet."""

from __future__ import annotations

import os

import torch

from engine.request import SamplingParams, TokenHistory
from engine.sample.filters import sampling_probs
from engine.sample.penalties import penalize
from engine.sample.race import NOT_RACED, race_key, race_params
from engine.scheduler.output import SampledToken
from engine.structured.matcher import apply_token_bitmask
from engine.transfer import to_device
from ninfer_kernels import race_noise
from ninfer_kernels.race_noise.naive import race_uniform

XTC_INDEX = 2**32 - 1  # the XTC coin's uniform: the race's hash at an index past every vocabulary


def _add_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits [R, V] plus each row's logit_bias (a copy)."""
    triples = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
    rows, tokens, biases = zip(*triples)
    device = logits.device
    index = (to_device(rows, torch.long, device), to_device(tokens, torch.long, device))
    return logits.index_put(index, to_device(biases, logits.dtype, device), accumulate=True)


def _allow_only(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits [R, V] with every token a row's allowed_token_ids leave out at -inf (a copy)."""
    out = logits.clone()
    for i, p in enumerate(params):
        if p.allowed_token_ids:
            ids = to_device(p.allowed_token_ids, torch.long, logits.device)
            kept = out[i, ids]
            out[i].fill_(float("-inf"))
            out[i, ids] = kept
    return out


def _ban(logits: torch.Tensor, banned: list[tuple[int, ...]]) -> torch.Tensor:
    """logits [R, V] with each row's banned token ids at -inf (a copy)."""
    pairs = [(i, t) for i, ids in enumerate(banned) for t in ids]
    rows, tokens = zip(*pairs)
    device = logits.device
    index = (to_device(rows, torch.long, device), to_device(tokens, torch.long, device))
    return logits.index_put(index, torch.tensor(float("-inf"), dtype=logits.dtype, device=device))


def _read_back(
    token_ids: torch.Tensor, accepted: torch.Tensor | None, surprise: torch.Tensor | None
) -> tuple[list[int], list, list[float] | None]:
    """One read back: the tokens [R], whether each verified its draft (all False without drafts), and
    Mirostat's surprises when there are any (then all three as float64: token ids are exact in it)."""
    if surprise is None:
        if accepted is None:
            return token_ids.tolist(), [False] * len(token_ids), None
        ids, flags = torch.stack([token_ids, accepted.to(token_ids.dtype)]).tolist()
        return ids, flags, None
    flags = accepted if accepted is not None else torch.zeros_like(token_ids, dtype=torch.bool)
    ids, flags, surprises = torch.stack([token_ids.double(), flags.double(), surprise]).tolist()
    return [int(t) for t in ids], flags, surprises


class Sampler:
    def __init__(self):
        self._seeds: dict[str, int] = {}  # request id -> its seed (a random one when it gave none)
        self._mirostat_mu: dict[str, float] = {}  # a Mirostat request's target surprise now (bits)

    @property
    def num_live_seeds(self) -> int:
        return len(self._seeds)

    def forget(self, request_id: str) -> None:
        self._seeds.pop(request_id, None)
        self._mirostat_mu.pop(request_id, None)

    def _seed(self, request_id: str, params: SamplingParams) -> int:
        seed = self._seeds.get(request_id)
        if seed is None:
            seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
            self._seeds[request_id] = seed
        return seed

    def draft_race(
        self, request_id: str, params: SamplingParams, first_position: int, count: int
    ) -> tuple[tuple[float, ...], list[int]]:
        """What a drafter races for a request's drafts at `first_position` onwards (engine/sample/race.py):
        (its race parameters, the race keys of its `count` positions); a greedy request's say greedy."""
        race = race_params(params)
        if race == NOT_RACED:
            return race, [0] * count
        seed = self._seed(request_id, params)
        return race, [race_key(seed, first_position + k) for k in range(count)]

    def __call__(
        self,
        logits: torch.Tensor,  # [R, V] fp32
        request_ids: list[str],
        params: list[SamplingParams],
        histories: list[TokenHistory | None] | None = None,
        draft_ids: list[int] | None = None,
        token_masks: torch.Tensor | None = None,  # [R, ceil(V / 32)] int32: allowed tokens (structured)
        banned: list[tuple[int, ...]] | None = None,  # per row: token ids it may not be (min_tokens)
        positions: list[int] | None = None,  # per row: the position of the token it samples (None: 0)
    ) -> list[SampledToken]:
        """One token per row. All on the device; the only host sync is reading the results back.

        A row with a draft token (`draft_ids[i] >= 0`, speculative decoding) verifies it: greedy rows
        accept it when it is the argmax; sampled rows draw from p as they would without it and accept it
        when the draw is the draft. That is speculative sampling's rule for a draft that is one token, not a
        distribution: accepted with probability p(draft), and otherwise a token from p without the draft;
        and it emits the very token the row draws without drafts. `SampledToken.accepted` says which rows
        accepted. `token_masks` (structured outputs) leave each row only the tokens its grammar allows,
        and `banned` takes those ids from its row (a request's EOS before min_tokens); a draft outside what
        is left is rejected."""
        num_rows, vocab = logits.shape
        device = logits.device
        raw = logits
        if token_masks is not None:
            logits = apply_token_bitmask(logits, token_masks)
        if any(p.logit_bias for p in params):
            logits = _add_logit_bias(logits, params)
        if banned is not None:
            logits = _ban(logits, banned)
        if any(p.allowed_token_ids for p in params):
            logits = _allow_only(logits, params)
        if any(p.needs_history for p in params):
            assert histories is not None, "penalties and DRY need the token history"
            logits = penalize(logits, params, histories)
        token_ids = logits.argmax(dim=-1)  # [R]
        drafted = draft_ids is not None and any(d >= 0 for d in draft_ids)
        drafts = to_device(draft_ids, torch.long, device) if drafted else None  # [R], -1 = none
        accepted = token_ids == drafts if drafted else None  # [R] bool (greedy rows)
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        steered: list[int] = []  # Mirostat's rows
        mu: dict[int, float] = {}  # their mu before this step (bits)
        surprise = None  # [R] float64: a Mirostat row's surprise (bits) at the token it drew
        if sampled_rows:
            rows = to_device(sampled_rows, torch.long, device)
            row_params = [params[i] for i in sampled_rows]
            # exponential race (engine/sample/race.py): argmax(p / E) with E ~ Exp(1) samples from p; a row's
            # noise is a hash of its request's seed, its position and the token id, so a seeded request's
            # draws depend neither on the batch nor on the steps that came before
            keys = [
                race_key(self._seed(request_ids[i], params[i]), positions[i] if positions is not None else 0)
                for i in sampled_rows
            ]
            noise = race_noise(to_device(keys, torch.int64, device), vocab)  # [S, V]
            coins = [
                params[i].xtc_probability > 0
                and not params[i].mirostat
                and race_uniform(key, XTC_INDEX) < params[i].xtc_probability
                for i, key in zip(sampled_rows, keys)
            ]
            xtc_rows = to_device(coins, torch.bool, device) if any(coins) else None  # [S]: XTC's coin came up
            # Mirostat's state (mu starts at 2 tau) steers its rows; each draws one token (no drafts)
            mu = {
                i: self._mirostat_mu.get(request_ids[i], 2 * params[i].mirostat_tau)
                for i in sampled_rows
                if params[i].mirostat
            }
            steered = list(mu)
            mus = [mu.get(i, 0.0) for i in sampled_rows] if mu else None
            probs = sampling_probs(logits[rows], row_params, xtc_rows, mus)  # [S, V]
            drawn = (probs / noise).argmax(dim=-1)  # [S]
            if drafts is not None:  # (a row without a draft has -1: never drawn)
                accepted = accepted.index_copy(0, rows, drawn == drafts[rows])
            token_ids = token_ids.index_copy(0, rows, drawn)
            if steered:  # under the distribution each row drew from
                picked = -torch.log2(probs.gather(1, drawn.unsqueeze(1)).squeeze(1)).double()
                surprise = torch.zeros(num_rows, dtype=torch.float64, device=device).index_copy(
                    0, rows, picked
                )
        if drafts is not None:
            token_ids = torch.where(accepted, drafts, token_ids)
        max_logprobs = max((p.logprobs for p in params if p.logprobs is not None), default=None)
        ids, flags, surprises = _read_back(token_ids, accepted, surprise)
        for i in steered:  # mu -= eta (surprise - tau)
            p = params[i]
            self._mirostat_mu[request_ids[i]] = mu[i] - p.mirostat_eta * (surprises[i] - p.mirostat_tau)
        if max_logprobs is None:
            return [SampledToken(t, None, bool(a)) for t, a in zip(ids, flags)]
        logprobs = torch.log_softmax(raw, dim=-1)  # NOTE: of the raw model distribution
        chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        top = torch.topk(logprobs, max(max_logprobs, 1), dim=-1)
        chosen, top_ids, top_vals = chosen.tolist(), top.indices.tolist(), top.values.tolist()
        out = []
        for i, p in enumerate(params):
            lp = None
            if p.logprobs is not None:
                lp = {ids[i]: chosen[i]}
                lp.update(zip(top_ids[i][: p.logprobs], top_vals[i][: p.logprobs]))
            out.append(SampledToken(ids[i], lp, bool(flags[i])))
        return out
