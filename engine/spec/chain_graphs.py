"""CUDA graphs for the drafters' chained steps (spec mtp: the MTP head; spec draft: the draft model).

After a step, a drafter drafts its 2nd .. k-th tokens one position at a time for every drafting request:
each such step is the MTP head's layer, its norm and the draft head (about twenty launches), or the whole
draft model and its head (a few hundred), over one token a request, k - 1 times a step; at that size the
launches, not the GPU, set the pace. Each batch bucket (and, for a head of several layers, each layer) is
captured once over static buffers, as the decode graphs are (engine/worker/cuda_graphs.py): the step's
inputs (the drafts just made, the MTP head's last hidden states, positions, slots; for sampled or penalized
requests the race keys, parameters and penalty terms of their drafts, engine/spec/race.py) are copied in,
the graph replays, and its outputs (hidden states, drafts) feed the next step without leaving the device.
Padding rows write no KV (slot -1) and read their row's first page. A step with a sampled or penalized
request replays the raced graph (captured beside the plain greedy one), so a plain greedy batch pays nothing
for the race.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.memory import graph_buckets
from engine.sample.race import NOT_RACED
from engine.spec.race import Race
from engine.transfer import copy_in
from engine.worker.block_table import BlockTables
from engine.worker.cuda_graphs import capture_graph
from engine.worker.forward_context import ForwardContext, set_forward_context

log = logging.getLogger("ninfer.graphs")

# one chained step: (drafts [b] int64, hidden states [b, H] or None, positions [b], variant, race) ->
# (hidden states [b, H], the next drafts [b])
ChainStep = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor, int, Race], tuple[torch.Tensor, torch.Tensor]
]


def mtp_chain_graphs(drafter, max_batch: int, max_blocks: int, device, dtype) -> ChainGraphs:
    """The MTP head's chain (engine/spec/mtp.MTPDrafter.head_step): a variant per head layer (step k runs
    layer k mod layers)."""
    model = drafter.model
    size, vocab = model.config.hidden_size, model.config.vocab_size
    return ChainGraphs(
        drafter.head_step, len(model.mtp.layers), size, max_batch, max_blocks, device, dtype, "MTP", vocab
    )


def draft_chain_graphs(drafter, max_batch: int, max_blocks: int, device, dtype) -> ChainGraphs:
    """The draft model's chain (spec draft, engine/spec/draft_model.DraftModelDrafter.chain_step): it takes
    no hidden states in."""
    return ChainGraphs(
        drafter.chain_step, 1, None, max_batch, max_blocks, device, dtype, "draft-model", drafter.vocab_size
    )


class ChainGraphs:
    def __init__(
        self,
        step: ChainStep,
        num_variants: int,
        hidden_size: int | None,
        max_batch: int,
        max_blocks: int,
        device: torch.device,
        dtype: torch.dtype,
        label: str,
        vocab: int,
    ):
        """`hidden_size`: the width of the hidden states a step takes in (None: it takes none); `vocab`: the
        model's, the width of a raced step's penalty terms."""
        self.step, self.num_variants, self.label = step, num_variants, label
        self.buckets = graph_buckets(max_batch)
        size = self.buckets[-1]
        self.ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.hidden = (
            None if hidden_size is None else torch.zeros(size, hidden_size, dtype=dtype, device=device)
        )
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.race_keys = torch.zeros(size, dtype=torch.int64, device=device)
        self.race_params = torch.tensor([NOT_RACED] * size, dtype=torch.float32, device=device)  # [size, 4]
        # the penalties' factors and subtrahends [size, V] (engine/spec/race.penalty_terms): 1 and 0 for none
        self.race_scale = torch.ones(size, vocab, dtype=torch.float32, device=device)
        self.race_bias = torch.zeros(size, vocab, dtype=torch.float32, device=device)
        self._penalty_rows = 0  # the leading rows of those two a staged step left other than 1 and 0
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.block_tables = BlockTables(device, size, max_blocks, grows=False)  # (each step's new pages)
        self.block_table = self.block_tables.table
        self.state_indices = torch.full((size,), -1, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(size + 1, dtype=torch.int32, device=device)
        # (bucket, variant, raced) -> graph
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[
            tuple[int, int, bool], tuple[torch.Tensor, torch.Tensor]
        ] = {}  # hidden [b, H], drafts [b]

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def _forward(self, b: int, variant: int, raced: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = ForwardContext(
            cu_seqlens_q=self.cu_seqlens_q[: b + 1],
            seq_lens=self.seq_lens[:b],
            slot_mapping=self.slot_mapping[:b],
            block_table=self.block_table[:b],
            state_indices=self.state_indices[:b],
            query_tokens_per_seq=1,
        )
        hidden = None if self.hidden is None else self.hidden[:b]
        with set_forward_context(ctx):
            race = (
                (self.race_keys[:b], self.race_params[:b], self.race_scale[:b], self.race_bias[:b])
                if raced
                else None
            )
            return self.step(self.ids[:b], hidden, self.positions[:b], variant, race)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for variant in range(self.num_variants):
            for raced in (False, True):
                for b in reversed(self.buckets):
                    graph, self.outputs[b, variant, raced] = capture_graph(
                        lambda b=b, variant=variant, raced=raced: self._forward(b, variant, raced), pool
                    )
                    pool = graph.pool()
                    self.graphs[b, variant, raced] = graph
        torch.cuda.synchronize()
        log.info(
            "captured %s draft-chain CUDA graphs for batch sizes %s",
            self.label,
            ", ".join(map(str, self.buckets)),
        )

    def clear(self) -> None:
        self.graphs.clear()
        self.outputs.clear()

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def stage(
        self,
        tokens: torch.Tensor,  # [n] int64 on the device: the drafts just made
        hidden: torch.Tensor | None,  # [n, H]: the MTP head's hidden states at the previous position
        positions: list[int],
        slots: list[int],
        block_rows: list[list[int]],
        rope_positions: list[int] | None = None,
        race: Race = None,  # keys [n], race parameters [n, 4], penalty terms [n, V] or None, on the device
    ) -> int:
        """Copy one chain step (n requests) into the buffers, padding to its bucket; returns the bucket.
        The block table gets only its rows' new pages (engine/worker/block_table.py): none while the same
        requests chain."""
        n = len(positions)
        b = self.bucket_for(n)
        pad = b - n
        self.ids[:n].copy_(tokens)
        if self.hidden is not None:
            self.hidden[:n].copy_(hidden)
        if race is not None:  # (a padding row's draft is cut, whatever it races)
            keys, params, scale, bias = race
            self.race_keys[:n].copy_(keys)
            self.race_params[:n].copy_(params)
            if scale is not None:
                self.race_scale[:n].copy_(scale)
                self.race_bias[:n].copy_(bias)
                self._penalty_rows = max(self._penalty_rows, n)
            elif self._penalty_rows:  # (back to none: a row beyond n is padding, whatever it holds)
                self.race_scale[: self._penalty_rows].fill_(1.0)
                self.race_bias[: self._penalty_rows].zero_()
                self._penalty_rows = 0
        # the rotary positions: behind the index after an image (engine/vision/mrope.py)
        rope = positions if rope_positions is None else rope_positions
        host = torch.tensor([*rope, *[0] * pad, *slots, *[-1] * pad], dtype=torch.int64).view(2, b)
        copy_in(self.positions[:b], host[0])
        copy_in(self.slot_mapping[:b], host[1])
        copy_in(self.seq_lens[:b], torch.tensor([p + 1 for p in positions] + [1] * pad, dtype=torch.int32))
        self.block_tables.stage(block_rows, b)
        return b

    def replay(self, n: int, step: int, raced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The staged chain step through its graph (`raced`: the one that races, for a step with a sampled or
        penalized request): (hidden [n, H], drafts [n])."""
        key = (self.bucket_for(n), step % self.num_variants, raced)
        self.graphs[key].replay()
        h, drafts = self.outputs[key]
        return h[:n], drafts[:n]

    def run_eager(self, n: int, step: int, raced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The staged step through the same buffers without a graph (the path a graph records; for tests)."""
        h, drafts = self._forward(self.bucket_for(n), step % self.num_variants, raced)
        return h[:n], drafts[:n]
