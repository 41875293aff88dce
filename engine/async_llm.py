"""AsyncLLM: the engine loop in a background thread, one async stream per request (the server's engine).

Only the engine thread touches the LLM. Callers send it commands (add, abort, call) through a queue; it
answers each add through a future (so a bad request fails in the caller before any streaming) and
delivers (RequestOutput, new text) items to the request's asyncio queue on the caller's event loop.
A stream that is closed before its request finishes (a client that went away) aborts the request,
which frees its KV pages and state slot at the next engine step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import NinferError
from engine.llm import LLM
from engine.request import Request, RequestOutput, SamplingParams
from engine.scheduler.step_tokens import StepTokens
from engine.vision.image import ImageInput

log = logging.getLogger("ninfer")
_STOP = object()
_ABORTED = object()  # put into an aborted stream's own queue: wakes a reader waiting on it
FAILING_STEPS = 3  # steps failed in a row past which /health says the engine is failing


class EngineDeadError(NinferError):
    """The engine loop failed; the server must be restarted."""


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: Any) -> bool:
        """Deliver to the caller's event loop; False when that loop is gone (the caller went away)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed
            return False
        return True


def _finite_wait(seconds: float | None) -> float | None:
    """An idle time a thread can wait for; None (wait for work however long) for one past what it can (and
    for infinity): beyond ~292 years."""
    return None if seconds is None or seconds >= threading.TIMEOUT_MAX else seconds


class _IdleTimer:
    """--sleep-idle-seconds: how long the engine loop waits for work before it sleeps (engine thread), or what
    the last request's own keep-alive (Ollama's `keep_alive`) said instead."""

    def __init__(self, seconds: float | None):
        self.default = self.seconds = _finite_wait(seconds)
        self.since = time.monotonic()
        self.refused = False  # a sleep refused: not tried again until work comes and goes

    def reset(self) -> None:
        self.since, self.refused = time.monotonic(), False

    def keep_alive(self, seconds: float | None) -> None:
        """Seconds idle before sleeping from now on (0: as soon as the work is done; math.inf: stay awake);
        None: the server's --sleep-idle-seconds again."""
        self.seconds = self.default if seconds is None else _finite_wait(seconds)

    def sleeps_at(self) -> float | None:
        """The wall-clock time (epoch seconds) a sleep is due if no work comes; None: it never is."""
        seconds = self.seconds  # (read from other threads: one attribute read)
        if seconds is None:
            return None
        return time.time() + max(0.0, self.since + seconds - time.monotonic())

    def remaining(self, sleep_level: int) -> float | None:
        """Seconds to wait for work before sleeping; None: wait for it however long it takes."""
        if self.seconds is None or sleep_level or self.refused:
            return None
        return max(0.0, self.since + self.seconds - time.monotonic())

    def sleep(self, llm: LLM) -> None:
        """The prefix cache file written first when it changed (nothing waits now, and a crash while asleep
        then keeps it); then level 1 (the prefix cache kept in host memory), else level 2 when host memory
        cannot hold the KV pool, else stay awake, said once."""
        llm.try_save_prefix_cache()
        try:
            llm.sleep(1)
        except NinferError as e:
            try:
                llm.sleep(2)
                log.info("slept at level 2, the prefix cache dropped: %s", e)
            except NinferError as e2:
                self.refused = True
                log.warning("idle for %g s, staying awake: %s", self.seconds, e2)


class AsyncStream:
    """The outputs of one request: `async for out, delta in stream`; `abort()` (or `aclose()`) stops it."""

    def __init__(self, engine: AsyncLLM, request_id: str, sink: _Sink):
        self.engine, self.request_id, self._sink = engine, request_id, sink
        self.finished = False

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> tuple[RequestOutput, str]:
        if self.finished:
            raise StopAsyncIteration
        item = await self._sink.queue.get()
        if item is _ABORTED:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        out, delta = item
        self.finished = out.finished
        return out, delta

    def abort(self) -> None:
        """Stop the request; a reader waiting for its next output (on this event loop) gets the end."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)
            self._sink.queue.put_nowait(_ABORTED)

    async def aclose(self) -> None:
        self.abort()


class AsyncLLM:
    """`LLM(model, **options)` run by a background engine thread; see LLM for the options."""

    def __init__(self, model: str | Path | None = None, **options: Any):
        self.llm = LLM(model, **options)
        self.tokenizer = self.llm.tokenizer
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._sinks: dict[str, _Sink] = {}  # engine thread only
        self._error: BaseException | None = None
        self._idle = _IdleTimer(self.llm.engine_config.sleep_idle_seconds)  # engine thread (sleeps_at: any)
        self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
        self._thread.start()

    # -- caller side (any thread, any event loop) ---------------------------------------------
    async def add_request(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | None = None,
        prompt: str | None = None,
        images: list[ImageInput] | None = None,
        after: str | None = None,
        snapshot_hints: tuple[int, ...] = (),
    ) -> AsyncStream:
        """Queue a request; raises NinferError (EngineOverloaded when the queue is full) if refused.
        `images`, `after`, `snapshot_hints`: as LLM.add_request takes them (LLM.image() makes an image; a
        caller's thread can)."""
        grammar = None
        if sampling_params.grammar is not None:  # compiled here, not in the engine loop other streams share
            grammar = await asyncio.to_thread(self.llm.grammar_matcher, sampling_params, prompt_token_ids)
        if sampling_params.uses_dry:  # DRY's breakers found here the first time (a scan of the vocabulary)
            await asyncio.to_thread(self.llm.dry_breakers, sampling_params)
        sink = _Sink(asyncio.get_running_loop(), asyncio.Queue())
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._send(
            (
                "add",
                list(prompt_token_ids),
                sampling_params,
                request_id,
                prompt,
                images,
                grammar,
                after,
                tuple(snapshot_hints),
                sink,
                done,
            )
        )
        request_id = await asyncio.wrap_future(done)
        return AsyncStream(self, request_id, sink)

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str | None = None,
        prompt: str | None = None,
    ) -> AsyncIterator[tuple[RequestOutput, str]]:
        """(output so far, new text) as tokens arrive; leaving the loop early aborts the request."""
        stream = await self.add_request(prompt_token_ids, sampling_params, request_id, prompt)
        try:
            async for item in stream:
                yield item
        finally:
            stream.abort()

    def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a LoRA adapter while serving: read and checked on a worker thread, put on the layers by the
        engine thread between steps."""
        pairs = await asyncio.to_thread(self.llm.adapters.read, name, path)
        await self._call(lambda: self.llm.load_adapter(name, path, pairs))

    async def unload_adapter(self, name: str) -> None:
        await self._call(lambda: self.llm.unload_adapter(name))

    async def reset_prefix_cache(self) -> None:
        await self._call(self.llm.reset_prefix_cache)

    async def sleep(self, level: int = 1) -> str:
        """LLM.sleep between steps: the device memory given back until the next request."""
        return await self._call(lambda: self.llm.sleep(level))

    async def wake_up(self) -> str:
        return await self._call(self.llm.wake_up)

    async def keep_alive(self, seconds: float | None) -> None:
        """How long the engine stays awake once idle, from the next request on (Ollama's `keep_alive`): 0
        sleeps as soon as the work is done, math.inf never, None goes back to --sleep-idle-seconds."""
        if seconds is not None and not seconds >= 0:
            raise NinferError(f"keep-alive must be 0 or more seconds (got {seconds!r})")
        await self._call(lambda: self._idle.keep_alive(seconds))

    def sleeps_at(self) -> float | None:
        """When the engine, idle from now on, would sleep (epoch seconds); None: never, or asleep already."""
        return None if self.llm.sleep_level else self._idle.sleeps_at()

    async def _call(self, fn) -> Any:
        """fn() run by the engine thread between steps; its NinferError is raised here."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._send(("call", fn, done))
        return await asyncio.wrap_future(done)

    def shutdown(self) -> None:
        """Stop the engine thread; then, once it has stopped, write the prefix cache (--prefix-cache-file). An
        engine stopped by an internal error is left as it is (said in the log when it stopped)."""
        if self._error is None:
            self._commands.put(_STOP)
            self._wakeup.set()
        self._thread.join(timeout=30)
        if self.llm.engine_config.prefix_cache_file is None:
            return
        if self._thread.is_alive() or self._error is not None:
            log.warning("the engine did not stop cleanly: the prefix cache file is left as it was")
            return
        self.llm.try_save_prefix_cache()

    @property
    def snapshots_enabled(self) -> bool:
        """Whether the engine snapshots a recurrent state inside prompts (a hybrid model with prefix caching):
        where add_request's `snapshot_hints` count."""
        return self.llm.scheduler.snapshots_enabled

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def failing(self) -> str | None:
        """A sentence for /health while the engine runs but its steps keep failing (each ends its requests with
        an error: a model or kernel bug that every batch meets); None while steps run."""
        n = self.llm.failed_steps
        if n < FAILING_STEPS:
            return None
        return (
            f"the last {n} engine steps failed ({self.llm.step_error}), so requests end with an error until "
            "one runs; the server log has the details"
        )

    def stats(self) -> dict[str, float]:
        """A snapshot for /metrics and /health (read without locking: plain ints)."""
        sched = self.llm.scheduler
        pool, states = sched.block_pool, sched.state_pool
        return {
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting),
            "kv_blocks_total": pool.num_blocks,
            "kv_blocks_free": pool.num_free_blocks,
            "prefix_cache_queries": pool.stats.queries,
            "prefix_cache_hits": pool.stats.hits,
            "prefix_cache_host_hits": pool.stats.host_hits,
            "host_cache_pages_used": pool.host.num_used if pool.host is not None else 0,
            "host_cache_pages_total": pool.host.num_slots if pool.host is not None else 0,
            "num_preemptions": sched.num_preemptions,
            "state_snapshots_used": len(states.snapshots) if states is not None else 0,
            "state_snapshots_total": states.num_snapshots if states is not None else 0,
            "state_snapshots_shared": states.num_shared_snapshots if states is not None else 0,
            "host_state_snapshots_used": states.num_host_snapshots if states is not None else 0,
            "host_state_snapshots_total": states.host.num_slots if states is not None and states.host else 0,
            "prefix_cache_state_lost_tokens": sched.num_state_lost_tokens,
            "spec_draft_tokens": sched.num_draft_tokens,
            "spec_accepted_tokens": sched.num_accepted_tokens,
            "spec_drafts": sched.num_drafts,
            "sleep_level": self.llm.sleep_level,
        }

    def step_tokens(self) -> StepTokens:
        """The tokens each engine step ran, as a histogram's counts (for /metrics; read without locking)."""
        return self.llm.scheduler.step_tokens

    def adapters_in_use(self) -> tuple[list[str], list[str]]:
        """The LoRA adapters the running requests run with, and the waiting ones (for /metrics; read without
        locking, from copies of the queues)."""
        sched = self.llm.scheduler

        def names(requests) -> list[str]:
            return sorted({name for r in list(requests) for name, _ in r.sampling_params.adapter_mix})

        return names(sched.running), names(sched.waiting)

    def running_requests(self) -> list[Request]:
        """The requests admitted to the engine now, in admission order (for GET /slots; read without locking,
        from a copy of the list: a request's counts may be a step behind)."""
        return list(self.llm.scheduler.running)

    def info(self) -> dict[str, str]:
        """How the engine runs, as allocated (for /metrics' ninfer_engine_info): device and dtype, the KV
        dtype of the caches, the pool's tokens beside the context limit, CUDA graphs as captured, speculative
        decoding."""
        llm = self.llm
        config, caches = llm.engine_config, llm.runner.kv_caches
        return {
            "device": config.device,
            "dtype": config.dtype,
            "kv_dtype": caches[0].kv_dtype if caches else "none",
            "kv_pool_tokens": str(llm.scheduler.block_pool.num_blocks * config.block_size),
            "max_context": str(llm.max_context),
            "cuda_graphs": "on" if llm.runner.graphs is not None else "off",
            "spec": config.spec,
            "draft_tokens": str(config.num_draft_tokens),
            "weight_quant": config.weight_quant,
        }

    def _send(self, command: Any) -> None:
        if self._error is not None:
            raise EngineDeadError(f"the engine stopped after an internal error ({self._error!r}); restart it")
        self._commands.put(command)
        self._wakeup.set()

    # -- engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a bug: fail every stream, refuse new requests
            self._error = e
            for sink in self._sinks.values():
                sink.put(EngineDeadError(f"the engine stopped after an internal error ({e!r})"))
            self._sinks.clear()
            raise

    def _loop(self) -> None:
        llm = self.llm
        idle = self._idle
        while True:
            if not llm.has_unfinished_requests() and not self._wakeup.wait(idle.remaining(llm.sleep_level)):
                idle.sleep(llm)  # idle for --sleep-idle-seconds: nothing came
                continue
            self._wakeup.clear()
            if not self._drain_commands():
                break
            idle.reset()
            if not llm.has_unfinished_requests():
                continue
            for out, delta in llm.step():
                sink = self._sinks.get(out.request_id)
                if sink is None:
                    continue
                if out.finished:
                    del self._sinks[out.request_id]
                if not sink.put((out, delta)) and not out.finished:
                    del self._sinks[out.request_id]
                    llm.abort(out.request_id)

    def _drain_commands(self) -> bool:
        """Apply queued commands; False once shutdown was asked for."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command is _STOP:
                return False
            if command[0] == "abort":
                if self._sinks.pop(command[1], None) is not None:
                    self.llm.abort(command[1])
                continue
            if command[0] == "call":
                _, fn, done = command
                try:
                    done.set_result(fn())
                except NinferError as e:
                    done.set_exception(e)
                except BaseException as e:  # a bug: the caller hears it, then the loop stops
                    done.set_exception(EngineDeadError(f"the engine stopped after an internal error ({e!r})"))
                    raise
                continue
            _, prompt_token_ids, params, request_id, prompt, images, grammar, after, hints, sink, done = (
                command
            )
            try:
                request_id = self.llm.add_request(
                    prompt_token_ids, params, request_id, prompt, images, grammar, after, hints
                )
            except NinferError as e:
                done.set_exception(e)
                continue
            except Exception as e:  # noqa: BLE001 - a bug reading this request: it is refused, the rest go on
                log.error("a request could not be added", exc_info=e)
                done.set_exception(e)
                continue
            self._sinks[request_id] = sink
            done.set_result(request_id)
