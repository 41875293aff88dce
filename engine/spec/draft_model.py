"""Draft tokens from a small model of the same vocabulary (spec draft: Qwen3-0.6B drafting for Qwen3-32B, as
llama.cpp's --model-draft and vLLM's draft-model speculation do), after each step.

The draft model's attention layers keep their KV in the pool's own pages: caches of their own shapes,
allocated beside the target's, addressed by the same block tables and slots. So prefix caching, preemption
and the host tier carry the draft's KV with the target's, and a page is the draft's as soon as it is the
target's. After a step, two things run:

1. One pass over the step's tokens that stand (a prompt chunk's; or the step's input token and the drafts
   it accepted) and, for a request that emitted tokens, its last one. It writes the draft model's KV at
   their positions and, from the last emitted token's logits, gives the first draft.
2. Chained steps of one token a request: each draft at the next position, up to `num_draft_tokens`. Their
   KV goes to positions the target has not run; when those tokens stand, their step's pass writes them
   again (a request's chain stops where its pages end).

The drafts are the draft model's greedy tokens (penalized where a request has penalties), or for a sampled
request its winners of the race the sampler will run at their positions (engine/spec/race.py); the target
verifies them as it verifies any drafts, so the output is the target's own. All on the device; the drafts
are read back once, at the end. On CUDA the chained steps replay captured graphs
(engine/spec/chain_graphs.py), as the MTP head's do.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import NinferError
from engine.formats.source import ModelSource
from engine.models.base import CausalLM
from engine.models.loader import load_model, open_source, quantized_at_load
from engine.scheduler.output import SampledToken, SchedulerOutput
from engine.spec.race import DraftRaces, Race, pick
from engine.spec.stored import per_request
from engine.tokenizer import Tokenizer
from engine.transfer import to_device
from engine.worker.block_table import BlockTables
from engine.worker.forward_context import paged_context, set_forward_context, slot_of


class DraftModelDrafter:
    def __init__(
        self, model: CausalLM, num_draft_tokens: int, block_size: int, device: torch.device, vocab_size: int
    ):
        """vocab_size: the target's; a draft whose head is wider (padded) never drafts past it."""
        self.model, self.num_draft_tokens = model, num_draft_tokens
        self.block_size, self.device, self.vocab_size = block_size, device, vocab_size
        self.graphs = None  # CUDA: the chained steps' graphs (engine/spec/chain_graphs.py)
        self.races = None  # the sampler's draft races (engine/spec/race.py); None: every draft greedy
        self.block_tables = BlockTables(device)  # the eager passes' (each gives only its rows' new pages)

    def drafts(self, hidden: torch.Tensor, race: Race) -> torch.Tensor:
        # hidden: [n, H] -> the draft model's drafts [n]: greedy, or raced for sampled rows
        return pick(self.model.compute_logits(hidden)[:, : self.vocab_size], race)

    def chain_step(
        self, tokens, hidden, positions, variant: int, race: Race = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chained step under the step's forward context, as engine/spec/chain_graphs.py captures it:
        tokens [n], positions [n] -> (hidden [n, H], the next drafts [n]); `hidden` and `variant` unused."""
        h = self.model(tokens, positions)
        return h, self.drafts(h, race)

    def _run(self, tokens, positions, cu_seqlens, seq_lens, slots, tables) -> torch.Tensor:
        """The draft model over `tokens` (host ids, or [T] on the device; KV written at `slots`): its
        final-normed hidden states [T, H]."""
        if not isinstance(tokens, torch.Tensor):
            tokens = to_device(tokens, torch.int64, self.device)
        ctx = paged_context(cu_seqlens, seq_lens, slots, self.block_tables.view(tables), self.device)
        with set_forward_context(ctx):
            return self.model(tokens, to_device(positions, torch.int64, self.device))

    @torch.inference_mode()
    def draft(
        self,
        sched: SchedulerOutput,
        hidden: torch.Tensor,  # the target's hidden states: unused (the MTP head's input)
        cu_seqlens: list[int],
        slot_mapping: list[int],
        sampled: dict[str, list[SampledToken]],
        mrope_positions: torch.Tensor | None = None,  # unused: a draft model serves no images
    ) -> dict[str, list[int]]:
        """Drafts for every request that emitted tokens this step (those after its last one)."""
        tokens, positions, slots, cu, seq_lens, tables = [], [], [], [0], [], []
        chains = []  # (request, row of its last emitted token in this pass)
        for i, r in enumerate(sched.scheduled):
            start = cu_seqlens[i]
            emitted = sampled.get(r.request_id)
            n = r.num_known_tokens + (len(emitted) - 1 if emitted else 0)  # the step's tokens that stand
            run, pos = list(r.token_ids[:n]), list(range(r.start_pos, r.start_pos + n))
            run_slots = slot_mapping[start : start + n]
            end = r.start_pos + n  # the last emitted token's position
            chained = bool(emitted) and end < len(r.block_ids) * self.block_size
            if chained:
                run.append(emitted[-1].token_id)
                pos.append(end)
                run_slots.append(slot_of(r.block_ids, end, self.block_size))
            if not run:
                continue
            tokens.extend(run)
            positions.extend(pos)
            slots.extend(run_slots)
            cu.append(cu[-1] + len(run))
            seq_lens.append(pos[-1] + 1)
            tables.append(r.block_ids)
            if chained:
                chains.append((r, cu[-1] - 1))
        if not tokens:
            return {}
        out = self._run(tokens, positions, cu, seq_lens, slots, tables)  # [T, H]
        if not chains:
            return {}
        active = list(range(len(chains)))  # chains still drafting
        first_pos = [positions[row] + 1 for _, row in chains]  # where each request's first draft goes
        requests = [r for r, _ in chains]
        races = DraftRaces.of(
            self.races, requests, first_pos, self.num_draft_tokens, self.device, self.vocab_size, sampled
        )
        last = out[to_device([row for _, row in chains], torch.int64, self.device)]
        steps = [(active, self.drafts(last, races.step(0)))]
        blocks_of = [r.block_ids for r, _ in chains]  # the same list while the same requests chain
        for step in range(1, self.num_draft_tokens):
            pos = [first_pos[c] + step - 1 for c in active]  # the previous draft's position
            fits = [i for i, p in enumerate(pos) if p < len(blocks_of[i]) * self.block_size]
            if not fits:
                break
            drafts = steps[-1][1]
            if len(fits) < len(active):
                keep = to_device(fits, torch.int64, self.device)
                drafts, races = drafts[keep], races.keep(keep)
                active, pos, blocks_of = (
                    [active[i] for i in fits],
                    [pos[i] for i in fits],
                    [blocks_of[i] for i in fits],
                )
            steps.append((active, self._chain_step(drafts, pos, blocks_of, races.step(step))))
        return per_request([r.request_id for r in requests], steps)  # the one read back

    def _chain_step(
        self, drafts: torch.Tensor, pos: list[int], blocks_of: list[list[int]], race: Race
    ) -> torch.Tensor:
        """One chained draft a request (`drafts` [n] on the device, each at its `pos`): the next drafts [n]."""
        slots = [slot_of(b, p, self.block_size) for b, p in zip(blocks_of, pos)]
        if self.graphs is not None and len(pos) <= self.graphs.max_batch:
            self.graphs.stage(drafts, None, pos, slots, blocks_of, race=race)
            drafts = self.graphs.replay(len(pos), 0, raced=race is not None)[1]
            return drafts.clone()  # the next replay rewrites the graph's outputs
        cu = list(range(len(pos) + 1))  # one token a request
        h = self._run(drafts, pos, cu, [p + 1 for p in pos], slots, blocks_of)  # [n, H]
        return self.drafts(h, race)


def open_draft_model(
    engine_config: EngineConfig, target: ModelConfig, tokenizer: Tokenizer | None
) -> ModelSource:
    """spec draft's draft model opened (its config and tokenizer, no weights yet) and checked that it can
    draft for the target: a plain decoder (no recurrent state, a head of its own) whose vocabulary is the
    target's. Called before the target's weights load, so a draft that cannot serve is said at once."""
    path = engine_config.draft_model
    source = open_source(path)
    draft = source.config
    if draft.num_linear_attention_layers:
        raise NinferError(
            f"the draft model {path} is a hybrid ({draft.architecture}: recurrent-state layers); a draft model "
            "is a plain decoder (Qwen3-0.6B / 1.7B, Qwen2.5-0.5B); for Qwen3.5 use --spec mtp"
        )
    if draft.embedding_model or draft.rerank == "classifier":
        raise NinferError(f"the draft model {path} has no LM head (an embedding model or a reranker)")
    check_vocabulary(path, source.tokenizer, tokenizer, draft, target)
    return source


def load_draft_model(source: ModelSource, engine_config: EngineConfig) -> CausalLM:
    """The opened draft model's weights, loaded as the target's are (device, dtype, weight precision)."""
    options = dict(spec="none", draft_model=None, vision=False, int8_prefill=False, lm_head_draft=0)
    config = replace(engine_config, model=str(engine_config.draft_model), **options)
    return load_model(quantized_at_load(source, config, strict=False), config)


def check_vocabulary(path, draft_tok: Tokenizer | None, target_tok: Tokenizer | None, draft, target) -> None:
    """The draft's token ids mean what the target's do: the same tokenizer, or (without tokenizers) the same
    vocabulary size."""
    if draft_tok is not None and target_tok is not None:
        mine, theirs = target_tok.backend.get_vocab(), draft_tok.backend.get_vocab()
        if mine != theirs:
            differs = next((t for t, i in mine.items() if theirs.get(t) != i), None)
            where = (
                f"'{differs}' is id {mine[differs]} here" if differs is not None else "it holds other tokens"
            )
            raise NinferError(
                f"the draft model {path} has another vocabulary ({where}, {theirs.get(differs)} there); a draft "
                "model shares the model's tokenizer (Qwen3-0.6B for a Qwen3 model)"
            )
        if draft.vocab_size < target_tok.vocab_size:
            raise NinferError(
                f"the draft model {path} embeds {draft.vocab_size} tokens, fewer than its tokenizer's"
            )
    elif draft.vocab_size != target.vocab_size:
        raise NinferError(
            f"the draft model {path} has {draft.vocab_size} token ids, the model {target.vocab_size}; a draft "
            "model shares the model's vocabulary"
        )
