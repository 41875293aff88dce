"""The Responses API's stored responses (store: true), kept in memory for previous_response_id, GET and
`item_reference` inputs."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from engine.api.errors import ApiError

MAX_STORED = 256


class ResponseStore:
    """The latest stored responses: each one's JSON, the conversation it ends (chat messages), and the
    input items it was given. Read by the prompt's render in a worker thread while the event loop stores
    others: every access holds the lock."""

    def __init__(self, capacity: int = MAX_STORED):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]] = (
            OrderedDict()
        )
        self._lock = threading.RLock()

    def put(
        self, response: dict[str, Any], history: list[dict[str, Any]], inputs: list[dict[str, Any]] = ()
    ) -> None:
        with self._lock:
            self._items[response["id"]] = (response, history, list(inputs))
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        with self._lock:
            if response_id not in self._items:
                raise ApiError(
                    404,
                    f"no stored response '{response_id}'; this server keeps the latest {self.capacity} "
                    "responses made with store: true, in memory (send the whole conversation as input instead)",
                )
            self._items.move_to_end(response_id)
            return self._items[response_id]

    def has(self, response_id: str) -> bool:
        with self._lock:
            return response_id in self._items

    def item(self, item_id: str) -> dict[str, Any] | None:
        """A stored response's input or output item by its id (the newest response that has it), else None."""
        with self._lock:
            for response, _, inputs in reversed(self._items.values()):
                for item in (*response.get("output", ()), *inputs):
                    if item.get("id") == item_id:
                        return item
        return None

    def resolve_references(self, given: Any) -> Any:
        """A request's `input` with each `item_reference` replaced by the stored item it names."""
        if not isinstance(given, list):
            return given
        out = []
        for i, entry in enumerate(given):
            if isinstance(entry, dict) and entry.get("type") == "item_reference":
                found = self.item(entry["id"]) if isinstance(entry.get("id"), str) else None
                if found is None:
                    raise ApiError(
                        404,
                        f"input[{i}] refers to item {entry.get('id')!r}, which no stored response has; this "
                        f"server keeps the items of its latest {self.capacity} stored responses (send the item "
                        "itself instead)",
                        "input",
                    )
                entry = found
            out.append(entry)
        return out

    def delete(self, response_id: str) -> None:
        with self._lock:
            self.get(response_id)
            del self._items[response_id]
