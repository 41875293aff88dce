"""CUDA graphs for decode steps.

A decode step launches every kernel of every layer for one token per sequence; at small batch the launches,
not the GPU, set the pace. Each batch-size bucket's forward (model + logits) is captured once into a CUDA
graph over static input buffers; a step copies its inputs into the buffers and replays the bucket that
holds its batch. Rows past the batch are padding: slot -1 (kv_store skips it), length 1 over the first
page its block-table row names (read, never written: a page of an earlier sequence, or page 0), state
slot -1 (the Gated DeltaNet ops give it zeros and touch no state), their logits dropped.

The block table is as wide as the longest context (max_context / block_size pages), so one capture serves
every length, and a step writes only its rows' new pages into it (engine/worker/block_table.py); the
split-K decode kernel divides each sequence's own length among its splits. Hybrid models'
recurrent-state resets, restores, backups and snapshots are copies outside the graph, before and after it.
LoRA adapters loaded at start-up are lanes of a second set of graphs: each layer they target adds every
lane's delta, each row weighted by its scale for that lane (0 for a row without it), so steps with adapters
replay too; a step in which no request runs an adapter replays the first set, without the lanes' products
(as vLLM specializes its graphs for LoRA).

With speculative decoding a step verifies drafts: q query tokens per sequence (its last known token and
q - 1 drafts, or on a hybrid model the tokens it recomputes after a rejected draft). Each (batch bucket, q)
for q = 1 .. max_query is captured; a step whose sequences all run the same q replays its graph (padding
sequences run q tokens over their row's first page and write nothing), any other runs eagerly.
"""

from __future__ import annotations

import logging

import torch

from engine.memory import graph_buckets
from engine.transfer import copy_in
from engine.worker.block_table import BlockTables
from engine.worker.forward_context import ForwardContext, set_forward_context

log = logging.getLogger("ninfer.graphs")
WARMUP_RUNS = 2  # eager runs per bucket before capture: Triton compiles its kernels, the allocator settles


def capture_graph(forward, pool=None):
    """Warm `forward` up on a side stream (Triton compiles, the allocator settles), then capture it into a
    CUDA graph drawing on `pool`: (graph, the outputs its replays rewrite)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = forward()
    return graph, outputs


class DecodeGraphs:
    def __init__(
        self,
        model,
        max_batch: int,
        max_blocks: int,
        device: torch.device,
        max_query: int = 1,
        lora_lanes: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        """lora_lanes: LoRA adapters (slots 0 .. lora_lanes - 1) every graph runs, each row weighted by its
        scale for that adapter (0: the row runs without it)."""
        self.model = model
        self.buckets = graph_buckets(max_batch)
        self.max_query = max_query
        size = self.buckets[-1]

        def zeros(*shape, dtype=torch.int32):
            return torch.zeros(*shape, dtype=dtype, device=device)

        # static inputs, the largest bucket; a bucket of b sequences x q tokens uses the first b * q rows
        self.input_ids = zeros(size * max_query, dtype=torch.int64)
        self.positions = zeros(size * max_query, dtype=torch.int64)
        self.slot_mapping = torch.full((size * max_query,), -1, dtype=torch.int64, device=device)
        # per sequence: a padding sequence has length max_query (its q tokens are the last of it, on its
        # row's first page)
        self.seq_lens = torch.full((size,), max_query, dtype=torch.int32, device=device)
        # each step writes only its rows' new pages (engine/worker/block_table.py)
        self.block_tables = BlockTables(device, size, max_blocks, grows=False)
        self.block_table = self.block_tables.table
        self.state_indices = torch.full((size,), -1, dtype=torch.int32, device=device)
        # [lanes, rows]: each row's scale for each LoRA lane (padding rows: 0)
        self.lora_scales = torch.zeros(lora_lanes, size * max_query, dtype=dtype, device=device)
        self.cu_seqlens_q = {  # q -> [size + 1]: q tokens a sequence
            q: torch.arange(0, size * q + 1, q, dtype=torch.int32, device=device) for q in self.query_counts
        }
        # (bucket, q) -> graph; (bucket, q, "lora") -> the graph with the LoRA lanes
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        # [b * q, H] and [b * q, V] each, written by its graph (the hidden states feed the MTP head)
        self.hidden: dict[tuple, torch.Tensor] = {}
        self.logits: dict[tuple, torch.Tensor] = {}

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    @property
    def query_counts(self) -> list[int]:
        return list(range(1, self.max_query + 1))

    def key(self, b: int, q: int, lora: bool) -> tuple:
        """The graph of b sequences x q tokens, with the LoRA lanes when `lora` and there are lanes."""
        return (b, q, "lora") if lora and self.lora_lanes else (b, q)

    def _context(self, b: int, q: int, lora: bool) -> ForwardContext:
        return ForwardContext(
            cu_seqlens_q=self.cu_seqlens_q[q][: b + 1],
            seq_lens=self.seq_lens[:b],
            slot_mapping=self.slot_mapping[: b * q],
            block_table=self.block_table[:b],
            state_indices=self.state_indices[:b],
            query_tokens_per_seq=q,
            lora_lanes=self.lora_scales[:, : b * q] if lora and self.lora_lanes else None,
        )

    @property
    def lora_lanes(self) -> int:
        return self.lora_scales.shape[0]

    def _forward(self, b: int, q: int, lora: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        with set_forward_context(self._context(b, q, lora)):
            hidden = self.model(self.input_ids[: b * q], self.positions[: b * q])  # [b * q, hidden]
            return hidden, self.model.compute_logits(hidden)  # [b * q, V]

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every (bucket, q), with the LoRA lanes and without when there are lanes, largest first,
        into one shared memory pool. The buffers hold padding only, so the warm-up and capture runs write no
        KV cache slot."""
        pool = None
        for lora in (True, False) if self.lora_lanes else (False,):
            for q in reversed(self.query_counts):
                for b in reversed(self.buckets):
                    key = self.key(b, q, lora)
                    graph, (self.hidden[key], self.logits[key]) = capture_graph(
                        lambda b=b, q=q, lora=lora: self._forward(b, q, lora), pool
                    )
                    pool = graph.pool()
                    self.graphs[key] = graph
        torch.cuda.synchronize()
        queries = (
            f"; {self.max_query} query counts a sequence (draft verification)" if self.max_query > 1 else ""
        )
        if self.lora_lanes:
            queries += f"; with and without {self.lora_lanes} LoRA lane(s)"
        log.info(
            "captured decode CUDA graphs for batch sizes %s%s", ", ".join(map(str, self.buckets)), queries
        )

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def stage(
        self,
        input_ids,
        positions,
        slot_mapping,
        seq_lens,
        block_rows: list[list[int]],
        state_indices=None,
        q: int = 1,
        lora: list[list[tuple[int, float]]] | None = None,
    ) -> int:
        """Copy one step (n sequences x q tokens, rows grouped by sequence) into the static buffers, padding
        up to its bucket; returns the bucket. state_indices: each sequence's recurrent-state slot (hybrid
        models; -1 where none). lora: each sequence's (LoRA lane, scale) pairs, for a replay with the lanes
        (None: one without them)."""
        n = len(block_rows)
        assert len(input_ids) == n * q and q <= self.max_query
        b = self.bucket_for(n)
        pad = (b - n) * q
        host = torch.tensor(
            [*input_ids, *[0] * pad, *positions, *[0] * pad, *slot_mapping, *[-1] * pad], dtype=torch.int64
        ).view(3, b * q)
        copy_in(self.input_ids[: b * q], host[0])
        copy_in(self.positions[: b * q], host[1])
        copy_in(self.slot_mapping[: b * q], host[2])
        slots = list(state_indices) if state_indices is not None else [-1] * n
        small = torch.tensor([*seq_lens, *[q] * (b - n), *slots, *[-1] * (b - n)], dtype=torch.int32)
        small = small.view(2, b)
        copy_in(self.seq_lens[:b], small[0])
        copy_in(self.state_indices[:b], small[1])
        self.block_tables.stage(block_rows, b)
        if lora is not None and self.lora_lanes:
            scales = torch.zeros(self.lora_lanes, b * q, dtype=self.lora_scales.dtype)
            for i, pairs in enumerate(lora):
                for lane, scale in pairs:
                    scales[lane, i * q : (i + 1) * q] = scale
            copy_in(self.lora_scales[:, : b * q], scales)
        return b

    def replay(self, n: int, q: int = 1, lora: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the staged step (n sequences x q tokens) through its graph, the one with the LoRA lanes when
        `lora`: hidden [n * q, H], logits [n * q, V]."""
        key = self.key(self.bucket_for(n), q, lora)
        self.graphs[key].replay()
        return self.hidden[key][: n * q], self.logits[key][: n * q]

    def clear(self) -> None:
        """Drop every captured graph and its outputs (a capture that failed part-way)."""
        self.graphs.clear()
        self.hidden.clear()
        self.logits.clear()

    def run_eager(self, n: int, q: int = 1, lora: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The staged step through the same buffers without a graph (the path a graph records; for tests)."""
        hidden, logits = self._forward(self.bucket_for(n), q, lora)
        return hidden[: n * q], logits[: n * q]


def captured_or_none(graphs):
    """`graphs` captured, or None (decode runs eagerly) when capturing fails: an op that cannot be captured
    must cost speed, not the start-up. The reason is logged once, with the flag that skips capturing."""
    try:
        graphs.capture()
    except RuntimeError as exc:  # torch raises capture errors (a host sync, an illegal op, OOM) as these
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning(
            "CUDA graph capture failed (%s); decoding without graphs (--no-cuda-graphs skips it)", reason
        )
        graphs.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None
    return graphs
