"""The offline API: LLM(model).generate(...) / .chat(...), and step-wise add_request / step."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from engine.cache.block_pool import BlockPool
from engine.cache.state_pool import StatePool
from engine.config import EngineConfig, check_device_visible
from engine.errors import NinferError
from engine.formats.gguf_mmproj import with_mmproj
from engine.lora.adapters import Adapters
from engine.models.loader import (
    holds_fp4,
    load_model,
    model_path,
    open_source,
    quantized_at_load,
    weight_quant_for,
)
from engine.output_processor import RequestStream
from engine.plan.preload import check_weights_fit
from engine.plan.runtime import device_memory, size_kv_pool
from engine.pooling import POOLED, normalized
from engine.quant.layer import holds_packed_weights
from engine.quant.on_load import BITS
from engine.request import Request, RequestOutput, SamplingParams
from engine.rerank import NOT_A_RERANKER, HeadTap, RerankHead, pair_prompt
from engine.sample.dry import BreakerMasks
from engine.sampling_defaults import resolve as resolve_sampling_defaults
from engine.scheduler.output import SchedulerOutput
from engine.scheduler.scheduler import Scheduler
from engine.sizes import format_bytes
from engine.spec.draft_model import load_draft_model, open_draft_model
from engine.structured.matcher import GrammarCompiler, GrammarMatcher
from engine.tokenizer import TURN_TOKEN, with_chat_template, with_template_kwargs
from engine.vision.config import VisionConfig
from engine.vision.image import ImageCache, ImageInput
from engine.vision.mrope import place_images
from engine.warmup import warm_up
from engine.worker import prefix_file
from engine.worker.host_kv import check_host_memory, host_slots_for, host_state_slots, page_bytes
from engine.worker.model_runner import ModelRunner

log = logging.getLogger("ninfer")

EMBEDDING_ONLY = (
    "this checkpoint is an embedding model (a decoder without an output head): it makes embeddings "
    "(/v1/embeddings, LLM.embed()), not text; serve a chat model to generate"
)
RERANKER_ONLY = (
    "this checkpoint is a reranker (a classifier in place of an output head): it scores query-document "
    "pairs (/v1/rerank, LLM.rerank()), not text; serve a chat model to generate"
)


class LLM:
    """Load a model (an HF checkpoint directory or a GGUF file; None = the embedded default) and generate."""

    def __init__(self, model: str | Path | None = None, **options: Any):
        """`options` are EngineConfig's fields, named as the `ninfer serve` flags: device, dtype,
        kv_dtype, kv_capacity, max_context, max_concurrency, max_pending, pending_timeout_ms,
        prefill_chunk, enable_prefix_caching, state_snapshot_interval, state_snapshots, block_size,
        cuda_graphs, spec, draft_tokens, rope_scaling (see EngineConfig for the rest)."""
        known = {f.name for f in fields(EngineConfig)} - {"model"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise NinferError(
                f"unknown LLM option {', '.join(unknown)}; the options are {', '.join(sorted(known))}"
            )
        self.engine_config = config = EngineConfig(model=str(model) if model is not None else "", **options)
        check_device_visible(config.device)
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        if config.host_cache:  # memory that is not there is said before the weights load
            check_host_memory(config.host_cache)
        if config.prefix_cache_file:  # so is a path that is not a prefix-cache file (never overwritten)
            prefix_file.check_file(config.prefix_cache_file)
        # --rope-scaling: the rotary tables and the context limit follow it
        source = open_source(model)
        if config.mmproj:  # a GGUF model's vision tower, in its own file
            source = with_mmproj(source, model_path(model), config.mmproj)
        source = replace(source, config=source.config.with_rope_scaling_flag(config.rope_scaling))
        # --weight-quant int8 / int4 (FP8: auto; NVFP4 / MXFP4 as stored) on a GPU
        held = quantized_at_load(source, config)
        # what the matrices are held as where they were quantized as they loaded (W4G128, W8G128), else None
        self.quantized_at_load = None
        if held is not source and not holds_fp4(source, config):  # (FP4 held as stored: its label)
            self.quantized_at_load = f"W{BITS[weight_quant_for(source, config.weight_quant)]}G128"
        stored, source = source, held
        self.model_config = source.config
        if (
            config.cache_reuse and self.model_config.num_linear_attention_layers
        ):  # said before the weights load
            raise NinferError(
                f"--cache-reuse shifts cached keys to new positions; {source.description} also keeps a "
                "recurrent state (Gated DeltaNet layers), which cannot be shifted: leave --cache-reuse out"
            )
        self.tokenizer = with_template_kwargs(
            with_chat_template(source.tokenizer, config.chat_template), config.chat_template_kwargs
        )
        # what a server request's left-out sampling fields default to
        checkpoint = self.tokenizer.sampling_defaults if self.tokenizer is not None else {}
        self.sampling_defaults = {
            **resolve_sampling_defaults(config.generation_config, checkpoint),
            **dict(config.override_generation_config),
        }
        self.description = source.description
        # a reranker's head (engine/rerank.py) is copied out of the weights as they load
        tap = HeadTap(source.config, self.tokenizer, config)
        # spec draft: the draft model checked before any weights load, loaded after the target's and before
        # the pool is sized (its KV shares the pool's pages)
        draft_source = (
            open_draft_model(config, self.model_config, self.tokenizer) if config.spec == "draft" else None
        )
        if config.device.startswith("cuda"):  # the weights against the memory free, before any of them loads
            check_weights_fit(stored, config, device_memory(config.device)[1], draft_source)
        self.model = load_model(tap.wrap(source), config)
        self.rerank_head: RerankHead | None = tap.head()
        self.draft_model = load_draft_model(draft_source, config) if draft_source is not None else None
        draft_config = self.draft_model.config if self.draft_model is not None else None
        # LoRA adapters on the target's layers, before the pool is sized from the memory left
        self.adapters = Adapters(self.model, config.torch_dtype, config.device)
        for name, path in config.lora_modules:
            self.adapters.add(name, path)
        # the KV pool from the memory ledger: refused here, before any allocation, when it does not fit
        packed = holds_packed_weights(self.model)
        self.max_context, kv_tokens = size_kv_pool(config, self.model_config, packed, draft_config)
        if draft_config is not None and draft_config.position_limit < self.max_context:
            raise NinferError(
                f"the draft model takes {draft_config.position_limit} positions, fewer than the context "
                f"{self.max_context}; use --max-context {draft_config.position_limit} or a draft model of the "
                "model's context"
            )
        num_blocks = kv_tokens // config.block_size
        hybrid = self.model_config.num_linear_attention_layers > 0
        state_pool = (
            StatePool(config.max_concurrency, config.num_state_snapshots, backups=config.num_draft_tokens > 0)
            if hybrid
            else None
        )  # (its host tier attached below, once the state slot's size is known)
        num_state_slots = state_pool.num_total_slots if state_pool else 0
        self.runner = ModelRunner(
            self.model,
            self.model_config,
            config,
            num_blocks,
            num_state_slots,
            self.max_context,
            backup_slot_base=state_pool.backup_slot_base if state_pool else None,
            draft_model=self.draft_model,
            adapters=self.adapters,
        )
        # the prefix cache's host tier (engine/cache/host_pool.py): a hybrid model's snapshots, then KV pages
        state_slot = self.runner.state_slot_bytes
        num_snapshots = state_pool.num_snapshots if state_pool else 0
        state_host_slots = host_state_slots(
            config.host_cache, config.host_state_snapshots, num_snapshots, state_slot
        )
        if state_host_slots:
            try:
                self.runner.attach_host_states(state_host_slots)
                state_pool.attach_host(state_host_slots)
            except NinferError as e:
                if config.host_state_snapshots is not None:  # asked for: refused in its sentence
                    raise
                log.warning("%s; running without host-memory state snapshots", e)  # the default: said
                state_host_slots = 0
        host_slots = 0
        if config.host_cache:
            kv_budget = config.host_cache - state_host_slots * state_slot
            host_slots = host_slots_for(kv_budget, page_bytes(self.runner.kv_caches))
            self.runner.attach_host_kv(host_slots)
        turn = self.tokenizer.token_to_id(TURN_TOKEN) if self.tokenizer is not None else None
        self.scheduler = Scheduler(
            config.scheduler_config(self.max_context, -1 if turn is None else turn),
            BlockPool(num_blocks, config.block_size, config.enable_prefix_caching, host_slots),
            state_pool,
        )
        eos = set(self.model_config.eos_token_ids)
        if self.tokenizer is not None:
            eos.update(self.tokenizer.eos_token_ids)
        self.eos_token_ids = tuple(sorted(eos))
        self.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        self._streams: dict[str, RequestStream] = {}
        # steps in a row that failed (one that runs starts the count again), and the last one's error: /health
        # answers 503 while every step fails (AsyncLLM.failing)
        self.failed_steps = 0
        self.step_error = ""
        self._ids = itertools.count()
        self._sleep_level = 0
        self.dry_breakers = BreakerMasks(self.tokenizer, self.model_config.vocab_size, self.description)
        visual = self.model.visual
        self._images = ImageCache(visual.config) if visual is not None else None
        if self.runner.device.type == "cuda":  # the prefill kernels compiled now, not in the first request
            warm_up(self)
        self._prefix_file_version = -1  # the pool's version the file holds (-1: none written or read)
        if config.prefix_cache_file:  # the prefix cache an earlier run left (engine/worker/prefix_file.py)
            message, read = prefix_file.load(self, config.prefix_cache_file)
            log.info("%s", message)
            if read:  # as the file holds it (another file is replaced at shutdown)
                self._prefix_file_version = self.scheduler.block_pool.version

    # -- step-wise API --------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | None = None,
        prompt: str | None = None,
        images: list[ImageInput] | None = None,
        grammar: GrammarMatcher | None = None,
        after: str | None = None,
        snapshot_hints: tuple[int, ...] = (),
    ) -> str:
        """`images`: preprocessed (`image()`), one for each <|image_pad|> of the prompt, in order.
        `grammar`: `grammar_matcher(sampling_params, ...)` made already; else made here. `after`: a
        request with the same prompt; this one waits until that one's prompt is in the prefix cache.
        `snapshot_hints`: prompt positions (before images widen) where a client expects to send the prefix
        again (its cache breakpoints): a hybrid model snapshots its recurrent state there too, at or before
        the page boundary."""
        request_id = request_id or f"req-{next(self._ids)}"
        if self.text_refusal and sampling_params.pooling is None:
            raise NinferError(self.text_refusal)
        self.adapters.require_mix(sampling_params.adapter_mix)
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise NinferError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        bad = next((t for t, _ in sampling_params.logit_bias if t >= vocab), None)
        if bad is not None:
            raise NinferError(f"logit_bias token id {bad} is outside the vocabulary (0..{vocab - 1})")
        bad = next((t for t in sampling_params.allowed_token_ids or () if t >= vocab), None)
        if bad is not None:
            raise NinferError(f"allowed_token_ids holds {bad}, outside the vocabulary (0..{vocab - 1})")
        bad = next((t for t in sampling_params.prediction if t >= vocab), None)
        if bad is not None:
            raise NinferError(f"prediction holds token id {bad}, outside the vocabulary (0..{vocab - 1})")
        bad = next((p for p in snapshot_hints if not 0 <= p <= len(prompt_token_ids)), None)
        if bad is not None:
            raise NinferError(f"snapshot hint {bad} is outside the prompt (0..{len(prompt_token_ids)})")
        mm = None
        # with the tower, every placeholder needs its image (a history whose pictures were left out)
        vision = self.vision_or_raise() if images or self.model.visual is not None else None
        if vision is not None and (images or vision.image_token_id in prompt_token_ids):
            prompt_token_ids, mm = place_images(list(prompt_token_ids), images or [], vision)
            snapshot_hints = mm.widened(snapshot_hints)
        if grammar is None:
            grammar = self.grammar_matcher(sampling_params, prompt_token_ids)
        sampling_params = self._with_hidden_stops(sampling_params)
        req = Request(
            request_id,
            list(prompt_token_ids),
            sampling_params,
            self.eos_token_ids,
            mm=mm,
            grammar=grammar,
            after=after,
            bad_word_ids=self._bad_word_ids(sampling_params.bad_words),
            dry_breakers=self.dry_breakers(sampling_params),
            cache_root=self.adapters.cache_root(sampling_params.adapter_mix),
            snapshot_hints=tuple(snapshot_hints),
        )
        stream = RequestStream(req, self.tokenizer, prompt)
        self.wake_up()  # NOTE: after every check, so a refused request never wakes the engine
        self.scheduler.add_request(req)  # the last check, then the only change: nothing half-added
        self._streams[request_id] = stream
        return request_id

    # -- sleep (engine/worker/sleep.py) ---------------------------------------------------------
    @property
    def sleep_level(self) -> int:
        """0 while awake; else the level it sleeps at."""
        return self._sleep_level

    def sleep(self, level: int = 1) -> str:
        """Give the device memory back while idle; the next request (or `wake_up`) takes it again. Level 1
        holds the weights, the KV pool and the recurrent states in host memory, so the prefix cache hits as
        before; level 2 holds the weights only and drops the prefix cache (less host memory; a prefix cache
        file is written first and keeps it for the next start). Refused in a sentence while requests run or
        wait, or when host memory cannot hold the bytes. Says what it did."""
        if level not in (1, 2):
            raise NinferError(
                f"sleep level {level} is not one of 1 (weights, KV pool and prefix cache held in host memory) "
                "or 2 (weights held, KV pool and prefix cache dropped)"
            )
        if self._sleep_level:
            if level > self._sleep_level:  # 1 -> 2 in place: no wake (its device memory may be taken)
                return self._deepen_sleep()
            return f"already asleep (level {self._sleep_level})"
        sched = self.scheduler
        busy = len(sched.running) + len(sched.waiting)
        if busy:
            raise NinferError(f"{busy} request(s) are running or waiting; sleep once they finish")
        started = time.monotonic()
        if level == 2:  # the prefix cache file keeps what level 2 drops (written first, if it changed)
            self.try_save_prefix_cache()
        memory = self.runner.sleep(keep_kv=level == 1)
        if level == 2:
            self.reset_prefix_cache()
            if self._prefix_file_version >= 0:  # not a change the file should follow: it keeps the cache
                self._prefix_file_version = self.scheduler.block_pool.version
        self._sleep_level = level
        message = (
            f"asleep (level {level}): {format_bytes(memory.device_bytes)} of {self.engine_config.device} memory "
            f"given back, {format_bytes(memory.host_bytes)} held in host memory, in "
            f"{time.monotonic() - started:.1f} s; the next request wakes it"
        )
        log.info("%s", message)
        return message

    def _deepen_sleep(self) -> str:
        """Asleep at level 1, to level 2: the KV pool's and states' host copies let go, the prefix cache
        dropped. A prefix cache file is not written first (that takes the device awake, and its memory
        may be another process's now): one that does not hold the latest cache is said."""
        file = self.engine_config.prefix_cache_file
        unwritten = file is not None and self._prefix_file_version != self.scheduler.block_pool.version
        freed = self.runner.deepen_sleep()
        self.reset_prefix_cache()
        if self._prefix_file_version >= 0:  # not a change the file should follow: it keeps the cache
            self._prefix_file_version = self.scheduler.block_pool.version
        self._sleep_level = 2
        note = (
            f"; the latest prefix cache was not written to {file} (that takes the device awake)"
            if unwritten
            else ""
        )
        message = (
            f"asleep (level 2): {format_bytes(freed)} of host memory freed, the prefix cache dropped{note}"
        )
        log.info("%s", message)
        return message

    def sleep_host_bytes(self) -> tuple[int, int]:
        """Host memory a sleep holds: (at level 1: weights, KV pool and states; at level 2: the weights)."""
        memory = self.runner.device_memory(keep_kv=False)  # (level 1 keeps every storage this one frees)
        return memory.device_bytes, memory.host_bytes

    def wake_up(self) -> str:
        """Take the device memory back after `sleep` (a no-op while awake); refused in a sentence, still
        asleep, when the device has not the memory free. Says what it did."""
        if not self._sleep_level:
            return "awake"
        started = time.monotonic()
        self.runner.wake()
        self._sleep_level = 0
        message = f"awake in {time.monotonic() - started:.1f} s"
        log.info("%s", message)
        return message

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (GPU pool, host tier, state snapshots), e.g. between benchmark runs
        that must start cold; running requests go on with their pages. Between steps only."""
        self.scheduler.reset_prefix_cache()

    def save_prefix_cache(self) -> None:
        """Write the prefix cache to `prefix_cache_file` (between steps, or once the engine has stopped), so
        the next start reads it back; said in the log. Skipped when nothing was cached or forgotten since the
        file was read or written (and it is there): an engine asleep then need not wake for it."""
        path = self.engine_config.prefix_cache_file
        if path is None:
            return
        if self.scheduler.block_pool.version == self._prefix_file_version and Path(path).exists():
            log.info("prefix cache: unchanged since %s was written or read", path)
            return
        if self._sleep_level == 1:  # the pages are in host memory until then (level 2 dropped them)
            self.wake_up()
        started = time.monotonic()
        version = self.scheduler.block_pool.version
        pages, snapshots = prefix_file.save(self, path)
        self._prefix_file_version = version
        snaps = f" and {snapshots} state snapshots" if self.scheduler.state_pool is not None else ""
        log.info(
            "prefix cache: %d pages (%d tokens)%s written to %s in %.1f s",
            pages,
            pages * self.engine_config.block_size,
            snaps,
            path,
            time.monotonic() - started,
        )

    def try_save_prefix_cache(self) -> None:
        """save_prefix_cache where what comes next goes on whatever happens (a sleep, a shutdown): a full disk,
        a device error or a wake the device cannot hold is said in the log instead of raised."""
        try:
            self.save_prefix_cache()
        except (OSError, RuntimeError, NinferError) as e:
            log.warning("could not write the prefix cache file (%s: %s)", type(e).__name__, e)

    def load_adapter(self, name: str, path: str, pairs: list | None = None) -> None:
        """Load a LoRA adapter (peft's save_pretrained folder, or a llama.cpp adapter .gguf); requests then
        name it in SamplingParams.adapter (or adapter_scales). `pairs`: Adapters.read's, read already."""
        self.wake_up()
        self.adapters.add(name, path, pairs, pool_sized=True)

    def unload_adapter(self, name: str) -> None:
        """Take a LoRA adapter off the model; refused while a request runs with it or waits to."""
        self.adapters.require(name)
        sched = self.scheduler
        users = self.adapters.users(name, [*sched.running, *sched.waiting])
        if users:
            raise NinferError(
                f"LoRA adapter '{name}' is in use by {users} request(s); unload it once they finish"
            )
        self.wake_up()
        self.adapters.remove(name)

    def _bad_word_ids(self, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """vLLM's bad_words as token ids: each word as the text would start with it and after a space."""
        if not words:
            return ()
        tok = self._tokenizer_or_raise()
        variants = (v for w in words for v in (w.lstrip(), " " + w.lstrip()))
        return tuple(
            dict.fromkeys(tuple(ids) for v in variants if (ids := tok.encode(v, add_special_tokens=False)))
        )

    def _with_hidden_stops(self, params: SamplingParams) -> SamplingParams:
        """A stop string that is a special token (a raw FIM client's "<|endoftext|>", "<|im_end|>") can never
        appear in the text, which leaves such tokens out: it stops as that token instead."""
        if self.tokenizer is None or not params.stop:
            return params
        hidden = [t for t in map(self.tokenizer.hidden_token_id, params.stop) if t is not None]
        if not hidden:
            return params
        return replace(params, stop_token_ids=tuple(dict.fromkeys((*params.stop_token_ids, *hidden))))

    def grammar_matcher(self, params: SamplingParams, prompt_token_ids: list[int]) -> GrammarMatcher | None:
        """What constrains a request's output: its structured-output grammar (engine/structured/grammars.py)
        compiled, and its thinking budget; None when neither applies. NinferError for a grammar that does not
        compile. Thread-safe: the server compiles off the engine loop."""
        return self.grammars.matcher(params.grammar, prompt_token_ids, params.thinking_budget)

    def abort(self, request_id: str) -> None:
        """Stop a request now: its KV pages and state slot are freed at once."""
        self.scheduler.finish_request(request_id, "abort")
        self._streams.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[tuple[RequestOutput, str]]:
        """Run one engine step; return (output so far, new text) for each request that got a token
        (and a final output for each request that expired waiting for admission)."""
        sched = self.scheduler.schedule()  # (a failure here is the scheduler's: its books are not trusted)
        results = []
        for req in self.scheduler.expired:
            results.append((self._streams.pop(req.request_id).output(req.finish_reason), ""))
        self.scheduler.expired.clear()
        try:
            results += self._run_step(sched)
        except Exception as e:  # noqa: BLE001 - the step's requests fail; the others go on
            return results + self._fail_step(sched, e)
        self.failed_steps = 0
        return results

    def _run_step(self, sched: SchedulerOutput) -> list[tuple[RequestOutput, str]]:
        result = self.runner.execute(sched)
        results = []
        for req, num_new in self.scheduler.update_from_output(sched, result):
            stream = self._streams[req.request_id]
            new = req.output_token_ids[len(req.output_token_ids) - num_new :]
            for i, token_id in enumerate(new):
                stream.push(token_id)
                if stream.stopped:  # tokens after the one that completed a stop string are not output
                    self.scheduler.drop_output_tokens(req, len(new) - i - 1)
                    break
            if stream.stopped and not req.is_finished:
                self.scheduler.finish_request(req.request_id, "stop")
            elif stream.stopped and req.finish_reason == "length":
                # the stop string came at or before the token that reached max_tokens (several accepted
                # drafts in one step; or the last token itself): it ended the output, as without drafts
                req.finish_reason = "stop"
            if req.is_finished:
                stream.flush()
            delta = stream.take_delta(req.is_finished)
            results.append((stream.output(req.finish_reason), delta))
            if req.is_finished:
                del self._streams[req.request_id]
        return results + self._prompt_progress(sched)

    def _prompt_progress(self, sched: SchedulerOutput) -> list[tuple[RequestOutput, str]]:
        """For each request that asked (return_progress) and ran a prompt chunk without getting a token (its
        prompt not yet all in the cache: the chunk that completes it gives the first token), an output
        saying how far its prompt has come. Never less than it said before: a request preempted mid-prompt
        computes its prompt again from its cached pages, and says nothing until it is past that again."""
        progress = []
        for s in sched.scheduled:
            stream = self._streams.get(s.request_id)
            if stream is None or not stream.request.sampling_params.return_progress:
                continue
            req = stream.request
            if req.is_finished or req.num_computed_tokens >= req.num_prompt_tokens:
                continue
            if req.num_computed_tokens <= stream.progress_said:
                continue
            stream.progress_said = req.num_computed_tokens
            out = stream.output(None)
            out.prompt_progress = (
                req.num_prompt_tokens,
                max(req.num_cached_tokens, 0),
                req.num_computed_tokens,
            )
            progress.append((out, ""))
        return progress

    def _fail_step(self, sched: SchedulerOutput, error: Exception) -> list[tuple[RequestOutput, str]]:
        """A step that raised after it was scheduled (running the model, sampling, a grammar, the text):
        its requests end with finish_reason "error" and the error in a sentence; the engine goes on with the
        others. The prefix cache is forgotten when the step was to fill some of it (pages from the host
        tier, state snapshots), as those may be half-written. A device that no longer works (a CUDA error
        that sticks) re-raises: the engine stops."""
        if not self.runner.device_works():
            raise error
        log.error("an engine step failed; its requests end with an error", exc_info=error)
        self.scheduler.step_failed(sched)
        self.failed_steps += 1
        self.step_error = f"{type(error).__name__}: {error}"
        message = (
            f"the engine failed while running this request ({self.step_error}); the log has "
            "the details, and the engine goes on with other requests"
        )
        results = []
        for s in sched.scheduled:
            stream = self._streams.pop(s.request_id, None)
            if stream is None:  # its final output went out before the failure
                continue
            stream.request.error = message
            self.scheduler.finish_request(s.request_id, "error")
            results.append((stream.output("error"), ""))
        return results

    # -- convenience API --------------------------------------------------------------------------
    def generate(
        self,
        prompts: str | list[str] | None = None,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        prompt_token_ids: list[int] | list[list[int]] | None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt (text, or token ids); outputs come back in the prompts' order.
        sampling_params: one for every prompt, or a list of one per prompt (as vLLM takes them)."""
        requests: list[tuple[list[int], str | None]] = []
        if prompts is not None:
            for text in [prompts] if isinstance(prompts, str) else prompts:
                if not isinstance(text, str):
                    raise NinferError(
                        f"prompts are strings (got {type(text).__name__}); pass token ids as prompt_token_ids="
                    )
                requests.append((self._tokenizer_or_raise().encode(text), text))
        elif prompt_token_ids is not None:
            batch = (
                prompt_token_ids
                if prompt_token_ids and isinstance(prompt_token_ids[0], list)
                else [prompt_token_ids]
            )
            requests = [(list(ids), None) for ids in batch]
        else:
            raise NinferError("generate() needs prompts or prompt_token_ids")
        return self._run_all(requests, _params_per_prompt(sampling_params, len(requests)))

    def _run_all(
        self,
        requests: list[tuple[list[int], str | None]],
        params: SamplingParams | list[SamplingParams],
        shared_prefix: bool = False,
    ) -> list[RequestOutput]:
        """Run (token ids, text) requests to the end; outputs in their order. `params`: for all, or one per
        request. `shared_prefix`: the prompts begin alike, so the later ones wait until the first has run its
        prompt, then start from its pages."""
        per_request = params if isinstance(params, list) else [params] * len(requests)
        ids: list[str] = []
        try:
            for (toks, text), request_params in zip(requests, per_request, strict=True):
                after = ids[0] if shared_prefix and ids else None
                ids.append(self.add_request(toks, request_params, prompt=text, after=after))
        except NinferError:
            for request_id in ids:  # one bad prompt rejects the whole batch; nothing stays queued
                self.abort(request_id)
            raise
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(ids):
            for out, _ in self.step():
                if out.finished:
                    finished[out.request_id] = out
        return [finished[i] for i in ids]

    def embed(
        self,
        inputs: str | list[str] | list[int] | list[list[int]],
        normalize: bool = True,
    ) -> list[list[float]]:
        """The embedding of each input (text, or token ids): the final-normed hidden state at its last
        token, as Qwen3-Embedding pools, L2-normalized unless `normalize` is false. A text is encoded with
        the tokenizer's special tokens (an embedding model's tokenizer appends its end-of-text)."""
        single = isinstance(inputs, str) or (bool(inputs) and isinstance(inputs[0], int))
        batch = [inputs] if single else list(inputs)
        if not batch:
            raise NinferError("embed() needs at least one input")
        encode = self._tokenizer_or_raise().encode if any(isinstance(x, str) for x in batch) else None
        ids = [encode(x) if isinstance(x, str) else list(x) for x in batch]
        outs = self.generate(None, POOLED, ids)
        return [normalized(out.embedding) if normalize else list(out.embedding) for out in outs]

    @property
    def text_refusal(self) -> str | None:
        """Why this model makes no text (an embedding model, a classifier reranker); None when it does."""
        if not self.model.headless:
            return None
        return RERANKER_ONLY if self.rerank_head is not None else EMBEDDING_ONLY

    def rerank_ids(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        """The token ids of the prompt that asks the reranker about one query-document pair."""
        if self.rerank_head is None:
            raise NinferError(NOT_A_RERANKER)
        text = pair_prompt(query, document, instruction, self.model_config.rerank_template)
        return self._tokenizer_or_raise().encode(text, add_special_tokens=False)

    def rerank(self, query: str, documents: list[str], instruction: str | None = None) -> list[float]:
        """How relevant each document is to the query, a probability each, in the documents' order. The
        pairs share their prompt up to the document, so the prefix cache computes it once."""
        if not documents:
            raise NinferError("rerank() needs at least one document")
        prompts = [(self.rerank_ids(query, d, instruction), None) for d in documents]
        head = self.rerank_head
        assert head is not None  # rerank_ids refused otherwise
        return [head.score(out.embedding) for out in self._run_all(prompts, POOLED, shared_prefix=True)]

    def chat(
        self,
        messages: list[dict[str, Any]],
        sampling_params: SamplingParams | None = None,
        tools: list[dict[str, Any]] | None = None,
        images: list[ImageInput] | None = None,
        **template_kwargs: Any,
    ) -> RequestOutput:
        """Render the chat template, generate, return the assistant's reply. `images`: one for each
        {"type": "image"} part of the messages' contents, in order (`image()` makes one)."""
        *_, out = self.stream_chat(messages, sampling_params, images, tools=tools, **template_kwargs)
        return out[1]

    def stream_chat(
        self,
        messages: list[dict[str, Any]],
        sampling_params: SamplingParams | None = None,
        images: list[ImageInput] | None = None,
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> Iterator[tuple[str, RequestOutput]]:
        """Like chat(), yielding (new text, output so far) as tokens arrive."""
        tok = self._tokenizer_or_raise()
        ids = tok.encode_chat(messages, tools, True, **template_kwargs)
        request_id = self.add_request(ids, sampling_params or SamplingParams(), images=images)
        try:
            while True:
                for out, delta in self.step():
                    if out.request_id != request_id:
                        continue
                    yield delta, out
                    if out.finished:
                        return
        finally:
            if request_id in self._streams:  # the caller stopped early (Ctrl-C): free the slot and KV
                self.abort(request_id)

    def image(self, data: bytes, max_pixels: int | None = None) -> ImageInput:
        """An encoded image (PNG, JPEG, WebP, GIF, BMP) made into the vision tower's input, resized within
        the checkpoint's pixel limits (or `max_pixels`, when lower); the same bytes again come from a cache
        of the latest (engine/vision/image.ImageCache)."""
        self.vision_or_raise()
        return self._images(data, max_pixels)

    def vision_or_raise(self) -> VisionConfig:
        """The vision tower's config; without a tower, the refusal of a request with images."""
        if self.model.visual is None:
            raise NinferError(
                "this engine runs without the vision tower, so it takes no images; start it with --vision "
                "(a Qwen3.5 or Qwen3-VL checkpoint with its vision tower), or --mmproj FILE with a GGUF"
            )
        return self.model.visual.config

    def _tokenizer_or_raise(self):
        if self.tokenizer is None:
            raise NinferError(f"{self.description} has no tokenizer; pass prompt_token_ids instead of text")
        return self.tokenizer


def _params_per_prompt(given: SamplingParams | list | tuple | None, count: int) -> SamplingParams | list:
    """generate()'s sampling_params: one for all (the defaults when None), or one per prompt."""
    if given is None or isinstance(given, SamplingParams):
        return given or SamplingParams()
    if not isinstance(given, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in given):
        raise NinferError("sampling_params is a SamplingParams, or a list of them (one per prompt)")
    if len(given) != count:
        raise NinferError(
            f"sampling_params lists {len(given)} SamplingParams for {count} prompt(s); give one per prompt, "
            "or a single one for all"
        )
    return list(given)
