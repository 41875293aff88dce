"""The Responses API's `background: true`: the reply runs as a task of the server's event loop while the
client polls `GET /v1/responses/{id}` (status queued, then in_progress, then completed, incomplete, failed
or cancelled) and may `POST /v1/responses/{id}/cancel` it. No client waits on the HTTP request, so a
client that goes away does not stop it; cancelling (or deleting) it aborts the engine request at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from engine.api.errors import ApiError
from engine.api.response_store import ResponseStore

log = logging.getLogger("ninfer")

RUNNING = ("queued", "in_progress")


class BackgroundResponses:
    """The background responses still running, by id (event loop only)."""

    def __init__(self, store: ResponseStore):
        self.store = store
        self._tasks: dict[str, asyncio.Task] = {}

    def start(
        self,
        queued: dict[str, Any],
        history: list[dict[str, Any]],
        inputs: list[dict[str, Any]],
        run: Callable[[Callable[[], None]], Awaitable[None]],
    ) -> None:
        """Store `queued` (status queued) and run `run(began)`, which stores the finished response; `began()`
        marks it in_progress (its first token is out). A failure is stored as status failed, a
        cancellation as cancelled, each with the conversation so far."""
        rid = queued["id"]
        self.store.put(queued, history, inputs)

        def began() -> None:
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

    def _restate(self, rid: str, status: str, error: dict[str, str] | None = None) -> None:
        try:
            response, history, inputs = self.store.get(rid)
        except ApiError:  # deleted meanwhile
            return
        if response["status"] not in RUNNING:
            return
        self.store.put({**response, "status": status, "error": error}, history, inputs)
