"""Draft tokens from the model's multi-token-prediction head (spec mtp), after each step.

The head predicts the token after next: from the model's final-normed hidden state at position p and the
token at p + 1, the token at p + 2. After a step, two things run:

1. One pass over every position of the step whose hidden state stands (the known tokens, and the drafts
   the step accepted), each paired with the token that follows it (the next prompt token, the accepted
   draft, or the token the step emitted). It writes the head's KV at those positions (its attention
   reads them in later steps) and, at a request's last position, gives its first draft.
2. Chained steps of one token a request: the head's own output hidden state stands in for the model's at
   the next position, paired with the draft just made, for up to `num_draft_tokens` drafts. Their KV
   goes to positions the model has not run yet; the next step's pass writes those again with the model's
   own hidden states. On CUDA these steps replay captured graphs (engine/spec/chain_graphs.py).

A sampled request's drafts are its winners of the race the sampler will run at their positions, raced over
the head's distribution as the sampler shapes the model's (engine/spec/race.py); a greedy request's are the
head's argmax (penalized where it has penalties). All on the device; the drafts are read back once, at the
end.
"""

from __future__ import annotations

import torch

from engine.scheduler.output import SampledToken, SchedulerOutput
from engine.spec.race import DraftRaces, Race, pick
from engine.spec.stored import per_request
from engine.transfer import to_device
from engine.worker.block_table import BlockTables
from engine.worker.forward_context import ForwardContext, paged_context, set_forward_context, slot_of


class MTPDrafter:
    def __init__(self, model, num_draft_tokens: int, block_size: int, device: torch.device):
        self.model, self.num_draft_tokens = model, num_draft_tokens
        self.block_size, self.device = block_size, device
        self.graphs = None  # CUDA: the chained steps' graphs (engine/spec/chain_graphs.py)
        self.races = None  # the sampler's draft races (engine/spec/race.py); None: every draft greedy
        self.block_tables = BlockTables(device)  # the eager passes' (each gives only its rows' new pages)

    def _tensor(self, x, dtype):
        return to_device(x, dtype, self.device)

    def _context(self, cu_seqlens, seq_lens, slot_mapping, tables) -> ForwardContext:
        return paged_context(cu_seqlens, seq_lens, slot_mapping, self.block_tables.view(tables), self.device)

    def _slot(self, block_ids: list[int], pos: int) -> int:
        return slot_of(block_ids, pos, self.block_size)

    def _chain_step(
        self, step: int, tokens, h, pos: list[int], blocks: list[list[int]], rope: list[int], race: Race
    ):
        """One chained draft a request: (the head's hidden states [n, H], the drafts [n]). `blocks` is the
        same list object for as long as the same requests chain (the graph stages its table once); `rope`:
        the rotary position of each `pos` (behind it after an image)."""
        slots = [self._slot(b, p) for b, p in zip(blocks, pos)]
        if self.graphs is not None and len(pos) <= self.graphs.max_batch:
            self.graphs.stage(tokens, h, pos, slots, blocks, rope, race)
            h, drafts = self.graphs.replay(len(pos), step, raced=race is not None)
            return h, drafts.clone()  # the next replay rewrites the graph's outputs
        ctx = self._context(list(range(len(pos) + 1)), [p + 1 for p in pos], slots, blocks)
        with set_forward_context(ctx):
            return self.head_step(tokens, h, self._tensor(rope, torch.int64), step, race)

    def head_step(
        self, tokens, hidden, positions, layer: int, race: Race = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chained step of the head under the step's forward context (run eagerly, or captured by
        engine/spec/chain_graphs.py): tokens [n], hidden [n, H], positions [n] -> (hidden [n, H], drafts
        [n])."""
        model = self.model
        h = model.mtp(positions, model.model.embed_tokens(tokens), hidden, layer)
        return h, pick(model.draft_logits(h), race)

    @torch.inference_mode()
    def draft(
        self,
        sched: SchedulerOutput,
        hidden: torch.Tensor,  # [T, H]: the model's final-normed hidden states of the step, rows by cu_seqlens
        cu_seqlens: list[int],
        slot_mapping: list[int],
        sampled: dict[str, list[SampledToken]],
        mrope_positions: torch.Tensor | None = None,  # [3, T]: the step's, when it had image tokens
    ) -> dict[str, list[int]]:
        """Drafts for every request that emitted tokens this step (those after its last one)."""
        rows, following, positions, slots, cu, seq_lens, tables = [], [], [], [], [0], [], []
        deltas = []  # rotary position - index of each row (engine/vision/mrope.py)
        chains = []  # (request, row of its last position in this pass)
        for i, r in enumerate(sched.scheduled):
            start, known = cu_seqlens[i], r.num_known_tokens
            emitted = sampled.get(r.request_id)
            if emitted:
                nxt = list(r.token_ids[1:known]) + [t.token_id for t in emitted]
            else:  # a prompt chunk: the next one starts with the token that follows it
                nxt = list(r.token_ids[1:]) + ([r.next_token_id] if r.next_token_id >= 0 else [])
            n = len(nxt)
            if n == 0:
                continue
            rows.extend(range(start, start + n))
            following.extend(nxt)
            positions.extend(range(r.start_pos, r.start_pos + n))
            deltas.extend([r.mm.rope_delta if r.mm else 0] * n)
            slots.extend(slot_mapping[start : start + n])
            cu.append(cu[-1] + n)
            seq_lens.append(r.start_pos + n)
            tables.append(r.block_ids)
            if emitted:
                chains.append((r, cu[-1] - 1))
        if not rows:
            return {}
        model = self.model
        if mrope_positions is not None:
            rope = mrope_positions[:, self._tensor(rows, torch.int64)]  # [3, Tm]
        else:
            rope = self._tensor([p + d for p, d in zip(positions, deltas)], torch.int64)
        with set_forward_context(self._context(cu, seq_lens, slots, tables)):
            out = model.mtp(
                rope,
                model.model.embed_tokens(self._tensor(following, torch.int64)),
                hidden[self._tensor(rows, torch.int64)],
            )  # [Tm, H]
        if not chains:
            return {}
        last = self._tensor([row for _, row in chains], torch.int64)
        h = out[last]  # [C, H]
        active = list(range(len(chains)))  # chains still drafting
        # the head's first chained row: the last emitted token's position (its first draft is the token after)
        first_pos = [positions[row] + 1 for _, row in chains]
        drafted_at = [p + 1 for p in first_pos]  # each request's first draft's position
        vocab = model.config.vocab_size
        requests = [r for r, _ in chains]
        races = DraftRaces.of(
            self.races, requests, drafted_at, self.num_draft_tokens, self.device, vocab, sampled
        )
        # (chains, their drafts [len(chains)])
        steps = [(active, pick(model.draft_logits(h), races.step(0)))]
        chain_delta = [deltas[row] for _, row in chains]
        for step in range(1, self.num_draft_tokens):
            # one position further; a request stops where its pages end
            pos = [first_pos[c] + step - 1 for c in active]
            fits = [i for i, c in enumerate(active) if pos[i] < len(chains[c][0].block_ids) * self.block_size]
            if not fits:
                break
            tokens = steps[-1][1]
            if len(fits) < len(active):
                keep = self._tensor(fits, torch.int64)
                h, tokens = h[keep], tokens[keep]
                active, pos = [active[i] for i in fits], [pos[i] for i in fits]
                races = races.keep(keep)
            if step == 1 or len(fits) < len(steps[-1][0]):  # a new set of requests: their pages
                blocks = [chains[c][0].block_ids for c in active]
            rope = [p + chain_delta[c] for p, c in zip(pos, active)]
            h, drafts = self._chain_step(step, tokens, h, pos, blocks, rope, races.step(step))
            steps.append((active, drafts))
        return per_request([r.request_id for r in requests], steps)  # the one read back
