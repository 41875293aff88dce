"""Turns a SchedulerOutput into flat input tensors, runs the model, samples."""

from __future__ import annotations

import itertools

import torch

import ninfer_kernels as kernels
from engine.cache.kv_layout import KVCache
from engine.cache.kv_shift import shift_kv
from engine.config import EngineConfig, ModelConfig
from engine.errors import NinferError
from engine.layers import rotary
from engine.layers.attention import Attention
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.lora.adapters import Adapters
from engine.models.base import CausalLM
from engine.sample.sampler import Sampler
from engine.scheduler.output import RunnerOutput, SchedulerOutput
from engine.spec.chain_graphs import draft_chain_graphs, mtp_chain_graphs
from engine.spec.draft_model import DraftModelDrafter
from engine.spec.mtp import MTPDrafter
from engine.transfer import to_device
from engine.worker.block_table import BlockTables
from engine.worker.cuda_graphs import DecodeGraphs, captured_or_none
from engine.worker.forward_context import (
    ForwardContext,
    set_forward_context,
)
from engine.worker.host_kv import HostTier, page_tensors, row_bytes
from engine.worker.image_embeddings import ImageEmbeddings
from engine.worker.prompt_logprobs import prompt_logprobs
from engine.worker.sleep import DeviceMemory
from ninfer_kernels.paged_attention import same_query_count


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        num_blocks: int,
        num_state_slots: int,
        max_context: int | None = None,
        backup_slot_base: int | None = None,
        draft_model: CausalLM | None = None,
        adapters: Adapters | None = None,
    ):
        """backup_slot_base: speculative decoding on a hybrid model: state slot s is backed up at
        backup_slot_base + s while a step verifies drafts (engine/cache/state_pool.py). draft_model: spec
        draft's drafter, whose KV caches take the same pages (engine/spec/draft_model.py)."""
        self.model, self.model_config = model, model_config
        self.device = torch.device(engine_config.device)
        self.block_size = engine_config.block_size
        # a decode step runs at most 1 + k tokens a request, or 1 + a prediction's drafts (so a hybrid model
        # recomputes at most that many accepted ones: ScheduledRequest.runs_prompt_chunk)
        self.num_draft_tokens = engine_config.num_draft_tokens
        self.most_verified = engine_config.num_prediction_tokens
        self.max_query = 1 + self.num_draft_tokens
        self.int8_prefill = engine_config.int8_prefill
        self.sampler = Sampler()
        dtype = engine_config.torch_dtype
        self.draft_model = draft_model
        for module in self._modules():
            if isinstance(module, Attention):
                module.kv_cache = KVCache.allocate(
                    engine_config.kv_dtype,
                    num_blocks,
                    self.block_size,
                    module.num_kv_heads,
                    module.head_dim,
                    self.device,
                )
            elif isinstance(module, GatedDeltaNet):
                kernel = model_config.linear_conv_kernel_dim
                module.conv_state = torch.zeros(
                    num_state_slots, module.conv_dim, kernel - 1, dtype=dtype, device=self.device
                )
                module.ssm_state = torch.zeros(
                    num_state_slots,
                    module.num_v_heads,
                    module.head_k_dim,
                    module.head_v_dim,
                    dtype=torch.float32,
                    device=self.device,
                )
        self._state_layers = [m for m in model.modules() if isinstance(m, GatedDeltaNet)]
        self.host_kv: HostTier | None = None  # the prefix cache's host tier, once attached
        self.host_states: HostTier | None = None  # its state snapshots (hybrid models), once attached
        self._rope_inv_freq: torch.Tensor | None = None  # --cache-reuse's key rotations, made at first use
        self.backup_slot_base = backup_slot_base
        k = engine_config.num_draft_tokens
        self.drafter: MTPDrafter | DraftModelDrafter | None = None
        if model.mtp is not None:
            self.drafter = MTPDrafter(model, k, self.block_size, self.device)
        elif draft_model is not None:
            vocab = model_config.vocab_size
            self.drafter = DraftModelDrafter(draft_model, k, self.block_size, self.device, vocab)
        if self.drafter is not None:  # a sampled request's drafts race the noise its draws will meet
            self.drafter.races = self.sampler.draft_race
        self.images = ImageEmbeddings(model.visual, self.device)
        self.adapters = adapters  # the served LoRA adapters (engine/lora)
        self.graphs: DecodeGraphs | None = None
        # the eager steps' block table (the graphs keep their own), which each step gives only its new pages
        self.block_tables = BlockTables(
            self.device, engine_config.max_concurrency, -(-(max_context or 0) // self.block_size)
        )
        # (not with the naive twins forced, NINFER_KERNELS=naive: they read lengths on the host, which no
        # graph can record)
        self._want_graphs = (
            engine_config.cuda_graphs
            and self.device.type == "cuda"
            and kernels.use_triton(torch.empty(0, device=self.device))
        )
        if self._want_graphs:
            assert max_context is not None, "CUDA graphs need the context limit (the block table's width)"
        self._graph_shape = (engine_config.max_concurrency, -(-(max_context or 0) // self.block_size), dtype)
        self.capture_graphs()
        self.asleep: DeviceMemory | None = None  # while asleep: the device memory given back

    def capture_graphs(self) -> None:
        """The decode steps' CUDA graphs (and the drafter's chained steps'), on CUDA with graphs on."""
        if not self._want_graphs:
            return
        batch, max_blocks, dtype = self._graph_shape
        adapters = self.adapters
        lanes = adapters.lane_count if adapters is not None else 0
        graphs = DecodeGraphs(
            self.model,
            batch,
            max_blocks,
            self.device,
            max_query=self.max_query,
            lora_lanes=lanes,
            dtype=dtype,
        )
        self.graphs = captured_or_none(graphs)
        if adapters is not None:
            adapters.graph_lanes = lanes if self.graphs is not None else 0
        if isinstance(self.drafter, MTPDrafter) and self.graphs is not None:
            chain = mtp_chain_graphs(self.drafter, batch, max_blocks, self.device, dtype)
            self.drafter.graphs = captured_or_none(chain)
        if isinstance(self.drafter, DraftModelDrafter) and self.graphs is not None:
            chain = draft_chain_graphs(self.drafter, batch, max_blocks, self.device, dtype)
            self.drafter.graphs = captured_or_none(chain)

    def _drop_graphs(self) -> None:
        for holder in (self, self.drafter):
            if holder is not None and holder.graphs is not None:
                holder.graphs.clear()
                holder.graphs = None
        if self.adapters is not None:
            self.adapters.graph_lanes = 0

    def device_memory(self, keep_kv: bool) -> DeviceMemory:
        """What sleeping gives back, and holds in host memory: every device tensor this runner reaches (the
        weights; with `keep_kv` the KV pool's and recurrent states' bytes too, else those come back zeroed),
        but the rotary tables other models share and the CUDA graphs (dropped, not held)."""
        discard = [] if keep_kv else [*page_tensors(self.kv_caches), *self._state_tensors()]
        graphs = [g for g in (self.graphs, getattr(self.drafter, "graphs", None)) if g is not None]
        return DeviceMemory([self], self.device, discard, shared=rotary.shared_tables(), skip=graphs)

    def sleep(self, keep_kv: bool) -> DeviceMemory:
        """Give the device memory back (engine/worker/sleep.py; see device_memory). Refused in a sentence,
        with nothing changed, when host memory cannot hold it."""
        assert self.asleep is None, "already asleep"
        memory = self.device_memory(keep_kv)
        memory.check_host_memory("sleeping")
        self._drop_graphs()
        try:
            memory.release()
        except NinferError:  # nothing was freed: the graphs come back, the engine runs on
            self.capture_graphs()
            raise
        self.asleep = memory
        return memory

    def deepen_sleep(self) -> int:
        """Asleep holding the KV pool and recurrent states (level 1): let their host copies go (they come
        back zeroed, as at level 2); the host bytes freed."""
        assert self.asleep is not None, "not asleep"
        return self.asleep.drop([*page_tensors(self.kv_caches), *self._state_tensors()])

    def wake(self) -> None:
        """The device memory back as it was, then the CUDA graphs captured again (the tensors moved)."""
        assert self.asleep is not None, "not asleep"
        self.asleep.restore()
        self.asleep = None
        self.capture_graphs()

    def _shift_kv(self, shifts: list[tuple[int, int, int]]) -> None:
        src, dst, by = zip(*shifts, strict=True)
        if self._rope_inv_freq is None:
            self._rope_inv_freq = rotary.inv_freq_for(self.model_config).to(self.device)
        shift_kv(
            self.kv_caches,
            to_device(list(src), torch.int64, self.device),
            to_device(list(dst), torch.int64, self.device),
            to_device(list(by), torch.float32, self.device),
            self._rope_inv_freq,
        )

    def device_works(self) -> bool:
        """Whether the device still runs work after a step raised: a CUDA error from a kernel (an illegal
        address, a device-side assert) sticks to the process, and every later call fails too; an
        out-of-memory error or a bug in host code leaves it working."""
        if self.device.type != "cuda":
            return True
        try:
            torch.cuda.synchronize(self.device)
        except RuntimeError:
            return False
        return True

    def _state_tensors(self) -> list[torch.Tensor]:
        return [t for layer in self._state_layers for t in (layer.conv_state, layer.ssm_state)]

    def _modules(self):
        """The target's modules, then the draft model's (spec draft)."""
        yield from self.model.modules()
        if self.draft_model is not None:
            yield from self.draft_model.modules()

    @property
    def kv_cache_bytes(self) -> int:
        return sum(cache.num_bytes for cache in self.kv_caches)

    def _reset_state(self, slot: int) -> None:
        for layer in self._state_layers:
            layer.conv_state[slot].zero_()
            layer.ssm_state[slot].zero_()

    def _copy_state(self, src: int, dst: int) -> None:
        self._copy_states([(src, dst)])

    def _copy_states(self, pairs: list[tuple[int, int]]) -> None:
        """Copy recurrent-state slots (src, dst) of every layer: one multi-tensor copy for them all, so a
        step's backups cost a launch, not two a layer a request."""
        if not pairs or not self._state_layers:
            return
        dst = [
            t[d]
            for layer in self._state_layers
            for t in (layer.conv_state, layer.ssm_state)
            for _, d in pairs
        ]
        src = [
            t[s]
            for layer in self._state_layers
            for t in (layer.conv_state, layer.ssm_state)
            for s, _ in pairs
        ]
        torch._foreach_copy_(dst, src)

    @property
    def kv_caches(self) -> list[KVCache]:
        """Every attention layer's cache, the draft model's too: what a page holds."""
        return [m.kv_cache for m in self._modules() if isinstance(m, Attention)]

    def attach_host_kv(self, num_slots: int) -> HostTier:
        """The host tier's storage: `num_slots` KV pages in host memory (pinned on CUDA)."""
        self.host_kv = HostTier(page_tensors(self.kv_caches), num_slots, self.device, "--host-cache")
        return self.host_kv

    @property
    def state_slot_bytes(self) -> int:
        """Bytes one recurrent-state slot holds across every linear-attention layer (0: none)."""
        return row_bytes(self._state_tensors()) if self._state_layers else 0

    def attach_host_states(self, num_slots: int) -> HostTier:
        """The host tier's state snapshots: `num_slots` recurrent-state slots in host memory."""
        self.host_states = HostTier(self._state_tensors(), num_slots, self.device, "--host-state-snapshots")
        return self.host_states

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        if self.host_kv is not None:  # before anything writes a page this step
            self.host_kv.copy(sched.swap_out, sched.swap_in)
        if self.host_states is not None:  # before the restores read the snapshot slots
            self.host_states.copy(sched.state_swap_out, sched.state_swap_in)
        if sched.kv_shifts:  # --cache-reuse: after the host tier has read the pages it evicts
            self._shift_kv(sched.kv_shifts)
        for request_id in sched.finished_request_ids:
            self.sampler.forget(request_id)
            self.images.forget(request_id)
        for request_id in sched.preempted_request_ids:  # (their seeds and Mirostat state stay)
            self.images.forget(request_id)
        if not sched.scheduled:
            return RunnerOutput({})
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        cu_seqlens = [0]
        seq_lens: list[int] = []
        state_indices: list[int] = []
        bs = self.block_size
        for r in sched.scheduled:
            n = len(r.token_ids)
            input_ids.extend(r.token_ids)
            pos = range(r.start_pos, r.start_pos + n)
            delta = r.mm.rope_delta if r.mm else 0  # after an image, a token's position trails its index
            positions.extend(pos if not delta else range(r.start_pos + delta, r.start_pos + n + delta))
            slot_mapping.extend(r.block_ids[p // bs] * bs + p % bs for p in pos)
            cu_seqlens.append(cu_seqlens[-1] + n)
            seq_lens.append(r.start_pos + n)
            state_indices.append(r.state_slot)
            if r.state_restore >= 0:  # a prefix-cache hit: continue from the snapshot
                self._copy_state(r.state_restore, r.state_slot)
            elif r.start_pos == 0 and r.state_slot >= 0:
                self._reset_state(r.state_slot)
        # the state each drafting request returns to when a draft fails
        self._copy_states(
            [
                (r.state_slot, self._backup_slot(r.state_slot))
                for r in sched.scheduled
                if r.draft_token_ids and r.state_slot >= 0
            ]
        )
        # a step with prompt tokens of a request with images runs eagerly: 3D positions, image embeddings
        multimodal = any(r.mm and r.start_pos < r.mm.positions.shape[1] for r in sched.scheduled)
        # so does a step with the rows of a LoRA adapter loaded after the graphs were captured (those loaded
        # before are lanes of the graphs that have lanes; a step without adapters replays one without)
        lanes = None
        if self.adapters is not None and any(r.sampling_params.adapter_mix for r in sched.scheduled):
            lanes = self.adapters.lane_scales(sched.scheduled)
            adapted = lanes is None
        else:
            adapted = False
        q = 0 if multimodal or adapted else self._graph_query_count(sched)
        # the rows sampled: each sampled request's last known token, then each of its drafts (a hybrid
        # model's recomputed tokens before them are not)
        rows = [
            j
            for i, r in enumerate(sched.scheduled)
            if r.sample
            for j in range(cu_seqlens[i + 1] - 1 - len(r.draft_token_ids), cu_seqlens[i + 1])
        ]
        if q:
            block_rows = [r.block_ids for r in sched.scheduled]
            self.graphs.stage(
                input_ids, positions, slot_mapping, seq_lens, block_rows, state_indices, q, lora=lanes
            )
            # [B * q, H], [B * q, V]
            hidden, logits = self.graphs.replay(len(sched.scheduled), q, lora=lanes is not None)
            if len(rows) < len(input_ids):
                logits = logits[to_device(rows, torch.int64, self.device)]
        else:
            rope_positions = (
                self._mrope_positions(sched, positions)
                if multimodal
                else to_device(positions, torch.int64, self.device)
            )
            hidden = self._forward(
                sched, input_ids, rope_positions, slot_mapping, cu_seqlens, seq_lens, state_indices
            )
            logits = (
                self.model.compute_logits(hidden[to_device(rows, torch.int64, self.device)]) if rows else None
            )
        self._save_states(sched)
        sampling = [r for r in sched.scheduled if r.sample]
        out = self._sample(logits, sampling) if sampling else RunnerOutput({})
        if any(r.prompt_logprob_targets for r in sched.scheduled):
            out = out._replace(
                prompt_logprobs=prompt_logprobs(self.model, hidden, sched.scheduled, cu_seqlens)
            )
        pooled = [(i, r) for i, r in enumerate(sched.scheduled) if r.pool_row >= 0]
        if pooled:  # a prompt's last row: its embedding (prefill steps only, off the decode hot path)
            rows_of = to_device([cu_seqlens[i] + r.pool_row for i, r in pooled], torch.int64, self.device)
            vectors = hidden[rows_of].float().cpu().tolist()  # [n, H]
            out = out._replace(embeddings={r.request_id: v for (_, r), v in zip(pooled, vectors)})
        if self.drafter is not None:
            mrope = rope_positions if multimodal else None
            drafts = self.drafter.draft(sched, hidden, cu_seqlens, slot_mapping, out.sampled, mrope)
            out = out._replace(drafts=drafts)
        return out

    def _mrope_positions(self, sched: SchedulerOutput, positions: list[int]) -> torch.Tensor:
        """[3, T] on the device: prompt tokens of requests with images at their 3D positions (time, row,
        column), every other token at its 1D position on all three axes."""
        out = torch.tensor(positions, dtype=torch.int64).expand(3, -1).clone()
        start = 0
        for r in sched.scheduled:
            if r.mm is not None:
                prompt = r.mm.positions.shape[1]
                end = min(r.start_pos + len(r.token_ids), prompt)
                if r.start_pos < end:
                    out[:, start : start + end - r.start_pos] = r.mm.positions[:, r.start_pos : end]
            start += len(r.token_ids)
        return out.to(self.device)

    def _forward(self, sched, input_ids, positions, slot_mapping, cu_seqlens, seq_lens, state_indices):
        """The model's eager forward over the step: final-normed hidden states [T, H]. positions: [T], or
        [3, T] in a step with image tokens."""

        def tensor(x, dtype):
            return to_device(x, dtype, self.device)

        image_rows, image_embeds = self.images.step_embeddings(sched, cu_seqlens)
        ctx = ForwardContext(
            cu_seqlens_q=tensor(cu_seqlens, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            slot_mapping=tensor(slot_mapping, torch.int64),
            block_table=self.block_tables.view([r.block_ids for r in sched.scheduled]),
            state_indices=tensor(state_indices, torch.int32),
            query_tokens_per_seq=same_query_count(cu_seqlens),
            int8_activations=self.int8_prefill
            and any(r.runs_prompt_chunk(self.most_verified) for r in sched.scheduled),
            image_rows=image_rows,
            image_embeds=image_embeds,
            lora=self.adapters.step_rows(sched.scheduled, cu_seqlens) if self.adapters is not None else (),
        )
        with set_forward_context(ctx):
            hidden = self.model(tensor(input_ids, torch.int64), positions)  # [T, hidden]
        self.images.release_consumed(sched)
        return hidden

    def _graph_query_count(self, sched: SchedulerOutput) -> int:
        """q when a captured graph holds the step: every request runs q tokens (1, or its last known token
        and drafts) and samples; 0 otherwise (the step runs eagerly)."""
        if self.graphs is None or len(sched.scheduled) > self.graphs.max_batch:
            return 0
        q = same_query_count([0, *itertools.accumulate(len(r.token_ids) for r in sched.scheduled)])
        return q if q <= self.graphs.max_query and all(r.sample for r in sched.scheduled) else 0

    def _save_states(self, sched: SchedulerOutput) -> None:
        """The step's state snapshots (hybrid prefix caching), after its forward."""
        self._copy_states(sched.state_saves)

    def _backup_slot(self, slot: int) -> int:
        assert self.backup_slot_base is not None, "drafts on a hybrid model need backup state slots"
        return self.backup_slot_base + slot

    def _token_masks(self, sampling: list, num_rows: int) -> torch.Tensor | None:
        """[rows, ceil(V / 32)] int32 on the device: the tokens each row's grammar allows (structured
        outputs, thinking budgets); all bits set for rows without one. None when no row is masked."""
        grammars = [r.grammar for r in sampling if r.grammar is not None]
        if not grammars:
            return None
        masks = torch.full((num_rows, grammars[0].num_words), -1, dtype=torch.int32)
        row, wrote = 0, False
        for r in sampling:
            if r.grammar is not None:
                wrote |= r.grammar.fill_masks(masks, row, r.draft_token_ids)
            row += len(r.draft_token_ids) + 1
        if not wrote:
            return None
        if self.device.type != "cuda":
            return masks
        return masks.pin_memory().to(self.device, non_blocking=True)

    def _sample(self, logits: torch.Tensor, sampling: list) -> RunnerOutput:
        """Sample each request's next token, or verify its drafts: it gets the tokens up to and including
        the first that is not an accepted draft. A hybrid request that rejects a draft gets its state
        back as it was before the step (the scheduler recomputes from start_pos)."""
        # logits: [rows, V]; per request 1 + len(draft_token_ids) rows
        request_ids, params, histories, draft_ids, banned, positions = [], [], [], [], [], []
        for r in sampling:
            for k in range(len(r.draft_token_ids) + 1):
                request_ids.append(r.request_id)
                positions.append(r.start_pos + r.num_known_tokens + k)  # where the row's token goes
                params.append(r.sampling_params)
                # penalties at a draft row count the drafts before it as generated
                drafted = list(r.draft_token_ids[:k])
                histories.append(
                    r.history._replace(output_ids=r.history.output_ids + drafted) if r.history else None
                )
                draft_ids.append(r.draft_token_ids[k] if k < len(r.draft_token_ids) else -1)
                banned.append(r.banned_rows[k] if k < len(r.banned_rows) else ())
        sampled = self.sampler(
            logits,
            request_ids,
            params,
            histories,
            draft_ids,
            self._token_masks(sampling, len(request_ids)),
            banned if any(banned) else None,
            positions,
        )
        out, restores, i = {}, [], 0
        for r in sampling:
            rows_of_r = sampled[i : i + len(r.draft_token_ids) + 1]
            i += len(rows_of_r)
            kept = next((n + 1 for n, t in enumerate(rows_of_r) if not t.accepted), len(rows_of_r))
            out[r.request_id] = rows_of_r[:kept]
            if r.state_slot >= 0 and kept <= len(r.draft_token_ids):
                restores.append((self._backup_slot(r.state_slot), r.state_slot))
        self._copy_states(restores)
        return RunnerOutput(out)
