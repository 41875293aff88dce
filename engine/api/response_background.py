"""The Responses API's `background: true`: the reply runs as a task of the server's event loop while the
client polls `GET /v1/responses/{id}` (status queued, then in_progress, then completed, incomplete, failed
or cancelled) and may `POST /v1/responses/{id}/cancel` it. No client waits on the HTTP request, so a
client that goes away does not stop it; cancelling (or deleting) it aborts the engine request at once.

With `stream: true` too, the task writes the stream's events into an `EventLog` and the request follows
it; a client that lost the stream (or another one) follows it again with `GET /v1/responses/{id}?stream=true
&starting_after=N`: the events after sequence number N, then the new ones as they come. A log is kept
while its response is stored."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from engine.api.errors import ApiError
from engine.api.response_store import ResponseStore

log = logging.getLogger("ninfer")

RUNNING = ("queued", "in_progress")


class EventLog:
    """A background response's stream: its events (SSE text; the i-th has sequence number i) and whether
    they have all been written (event loop only)."""

    def __init__(self):
        self.events: list[str] = []
        self.done = False
        self._changed = asyncio.Event()

    def add(self, event: str) -> None:
        self.events.append(event)
        self._wake()

    def close(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int, silence_s: float) -> AsyncIterator[str | None]:
        """The events after sequence number `after`, then each new one until the log is done; a None
        whenever `silence_s` pass without one (the route sends a keep-alive)."""
        sent = after + 1
        while True:
            while sent < len(self.events):
                sent += 1
                yield self.events[sent - 1]
            if self.done:
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), silence_s)
            if not changed.is_set():
                yield None


class BackgroundResponses:
    """The background responses still running, by id (event loop only)."""

    def __init__(self, store: ResponseStore):
        self.store = store
        self._tasks: dict[str, asyncio.Task] = {}
        self._logs: dict[str, EventLog] = {}  # the streamed ones' events, by id

    def start(
        self,
        queued: dict[str, Any],
        history: list[dict[str, Any]],
        inputs: list[dict[str, Any]],
        run: Callable[[Callable[[], None]], Awaitable[None]],
        events: EventLog | None = None,
    ) -> None:
        """Store `queued` (status queued) and run `run(began)`, which stores the finished response; `began()`
        marks it in_progress (its first token is out). A failure is stored as status failed, a
        cancellation as cancelled, each with the conversation so far. `events`: the log `run` writes a
        streamed one's events into (closed when it ends), for `follow`."""
        rid = queued["id"]
        self.store.put(queued, history, inputs)
        for gone in [i for i in self._logs if not self.store.has(i)]:  # forgotten: their logs too
            del self._logs[gone]
        if events is not None:
            self._logs[rid] = events

        started = []

        def began() -> None:
            if not started:
                started.append(True)
                self._restate(rid, "in_progress")

        async def task() -> None:
            try:
                await run(began)
            except asyncio.CancelledError:
                self._restate(rid, "cancelled")
                raise
            except ApiError as e:
                self._restate(rid, "failed", {"code": "server_error", "message": e.message})
            except Exception as e:  # noqa: BLE001 - a bug: said in the response and the log
                log.exception("background response %s failed", rid)
                message = f"internal error ({type(e).__name__}); see the server log"
                self._restate(rid, "failed", {"code": "server_error", "message": message})
            finally:
                self._tasks.pop(rid, None)
                if events is not None:
                    events.close()

        self._tasks[rid] = asyncio.get_running_loop().create_task(task())

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Stop a background response (a finished one is left as it is) and answer its stored state;
        refused in a sentence for a response that was not run in the background."""
        response = self.store.get(response_id)[0]
        task = self._tasks.get(response_id)
        if task is None:
            if not response.get("background"):
                raise ApiError(
                    400,
                    f"response '{response_id}' was not made with background: true; only those can be cancelled",
                )
            return response
        task.cancel()
        await asyncio.wait({task})  # (its cancellation is not raised here: this caller was not cancelled)
        return self.store.get(response_id)[0]

    def running(self, response_id: str) -> bool:
        return response_id in self._tasks

    def events(self, response_id: str, after: int) -> EventLog:
        """The event log of a stored response made with background and stream true, to follow from sequence
        number `after`; refused in a sentence for any other."""
        self.store.get(response_id)  # (a 404 for one not stored)
        events = self._logs.get(response_id)
        if events is None:
            raise ApiError(
                400,
                f"response '{response_id}' was not streamed in the background (background and stream true), so "
                "there is no stream to follow; GET it without stream",
                "stream",
            )
        if after >= len(events.events) and events.done:
            raise ApiError(
                400,
                f"'starting_after' is {after}, past the last event of response '{response_id}' "
                f"({len(events.events) - 1})",
                "starting_after",
            )
        return events

    def forget(self, response_id: str) -> None:
        """A deleted response's log."""
        self._logs.pop(response_id, None)

    def _restate(self, rid: str, status: str, error: dict[str, str] | None = None) -> None:
        try:
            response, history, inputs = self.store.get(rid)
        except ApiError:  # deleted meanwhile
            return
        if response["status"] not in RUNNING:
            return
        self.store.put({**response, "status": status, "error": error}, history, inputs)
