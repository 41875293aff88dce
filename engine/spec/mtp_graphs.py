"""CUDA graphs for the MTP head's chained draft steps (spec mtp).

After a step, the head drafts its 2nd .. k-th tokens one position at a time for every drafting request:
each such step is the head's layer, its norm and the draft head over one token a request, about twenty
launches, k - 1 times a step. Each batch bucket (and, for a head of several layers, each layer) is
captured once over static buffers, as the decode graphs are (engine/worker/cuda_graphs.py): the step's
inputs (the drafts just made, the head's last hidden states, positions, slots) are copied in, the graph
replays, and its outputs (hidden states, drafts) feed the next step without leaving the device. Padding
rows write no KV (slot -1) and read page 0.
"""

from __future__ import annotations

import logging

import torch

from engine.memory import graph_buckets
from engine.worker.cuda_graphs import capture_graph, stage_block_table
from engine.worker.forward_context import ForwardContext, set_forward_context

log = logging.getLogger("ninfer.graphs")


class ChainGraphs:
    def __init__(self, model, max_batch: int, max_blocks: int, device: torch.device, dtype: torch.dtype):
        self.model = model
        self.buckets = graph_buckets(max_batch)
        self.num_layers = len(model.mtp.layers)
        size = self.buckets[-1]
        self.ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(size, model.config.hidden_size, dtype=dtype, device=device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(size, max_blocks, dtype=torch.int32, device=device)
        self.state_indices = torch.full((size,), -1, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (bucket, layer) -> graph
        self._staged_rows: list | None = None  # the block rows the table holds (kept alive, so `is` is safe)
        self.outputs: dict[
            tuple[int, int], tuple[torch.Tensor, torch.Tensor]
        ] = {}  # hidden [b, H], drafts [b]

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def _forward(self, b: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = ForwardContext(
            cu_seqlens_q=self.cu_seqlens_q[: b + 1],
            seq_lens=self.seq_lens[:b],
            slot_mapping=self.slot_mapping[:b],
            block_table=self.block_table[:b],
            state_indices=self.state_indices[:b],
            query_tokens_per_seq=1,
        )
        model = self.model
        with set_forward_context(ctx):
            h = model.mtp(self.positions[:b], model.model.embed_tokens(self.ids[:b]), self.hidden[:b], layer)
            return h, model.draft_logits(h).argmax(-1)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for layer in range(self.num_layers):
            for b in reversed(self.buckets):
                graph, self.outputs[b, layer] = capture_graph(
                    lambda b=b, layer=layer: self._forward(b, layer), pool
                )
                pool = graph.pool()
                self.graphs[b, layer] = graph
        torch.cuda.synchronize()
        log.info("captured MTP draft-chain CUDA graphs for batch sizes %s", ", ".join(map(str, self.buckets)))

    def clear(self) -> None:
        self.graphs.clear()
        self.outputs.clear()

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def stage(
        self,
        tokens: torch.Tensor,  # [n] int64 on the device: the drafts just made
        hidden: torch.Tensor,  # [n, H]: the head's hidden states at the previous position
        positions: list[int],
        slots: list[int],
        block_rows: list[list[int]],
        rope_positions: list[int] | None = None,
    ) -> int:
        """Copy one chain step (n requests) into the buffers, padding to its bucket; returns the bucket.
        The block table is staged only for a new `block_rows` object: a chain passes the same one while
        the same requests draft (their pages do not change during a chain)."""
        n = len(positions)
        b = self.bucket_for(n)
        pad = b - n
        self.ids[:n].copy_(tokens)
        self.hidden[:n].copy_(hidden)
        # the rotary positions: behind the index after an image (engine/vision/mrope.py)
        rope = positions if rope_positions is None else rope_positions
        host = torch.tensor([*rope, *[0] * pad, *slots, *[-1] * pad], dtype=torch.int64).view(2, b)
        self.positions[:b].copy_(host[0])
        self.slot_mapping[:b].copy_(host[1])
        self.seq_lens[:b].copy_(torch.tensor([p + 1 for p in positions] + [1] * pad, dtype=torch.int32))
        if block_rows is not self._staged_rows:
            stage_block_table(self.block_table, block_rows, b)
            self._staged_rows = block_rows
        return b

    def replay(self, n: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The staged chain step through its graph: (hidden [n, H], drafts [n])."""
        key = (self.bucket_for(n), step % self.num_layers)
        self.graphs[key].replay()
        h, drafts = self.outputs[key]
        return h[:n], drafts[:n]

    def run_eager(self, n: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The staged step through the same buffers without a graph (the path a graph records; for tests)."""
        h, drafts = self._forward(self.bucket_for(n), step % self.num_layers)
        return h[:n], drafts[:n]
