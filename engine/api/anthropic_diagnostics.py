"""Anthropic's cache diagnostics: a Messages request with `diagnostics: {"previous_message_id": ...}` gets
`diagnostics.cache_miss_reason` saying why its prompt could not reuse the cached prefix of the earlier
reply's request — the agent's question "why did this turn compute everything again?", answered by the server
that knows.

A request that opts in (`previous_message_id` null on a session's first turn) is remembered under its reply's
id: the last 64, each as its model, the hashes of its system prompt, tools and messages (cache_control marks
left out: they do not change the prompt), and its prompt's tokens in 16-token pages. The two prompts are
compared page by page: where this one holds all of the earlier one's (its last two pages apart, where the
earlier one's generation prompt ends and the reply written after it may part from it), the prefix was
there to reuse and `diagnostics` is null. Otherwise the reason is the first of: the model, the
system prompt, the tools, an earlier message changed (not only messages appended) — and `unavailable`
where none of those did (another prompt-affecting parameter: thinking, tool_choice, the chat template's
variables). `cache_missed_input_tokens`: the earlier prompt's tokens after the pages the two share. An id
not remembered (never opted in, or long gone): `previous_message_not_found`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.api.errors import ApiError

KEPT = 64
PAGE = 16  # tokens a page compared


@dataclass(frozen=True)
class Fingerprint:
    model: str
    system: str
    tools: str
    messages: tuple[str, ...]
    pages: tuple[bytes, ...]  # the prompt's whole pages, each a hash of its token ids
    tokens: int


def requested(body: dict) -> tuple[bool, str | None]:
    """(whether the request opted in, the previous message id it names)."""
    if "diagnostics" not in body or body["diagnostics"] is None:
        return False, None
    diagnostics = body["diagnostics"]
    previous = diagnostics.get("previous_message_id") if isinstance(diagnostics, dict) else 0
    if previous is not None and not isinstance(previous, str):
        raise ApiError(400, "'diagnostics.previous_message_id' must be a message id (msg_...) or null")
    return True, previous


def fingerprint(body: dict, ids: list[int]) -> Fingerprint:
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    return Fingerprint(
        str(body.get("model")),
        _hash(body.get("system")),
        _hash(body.get("tools")),
        tuple(_hash(m) for m in messages),
        tuple(
            hashlib.blake2b(repr(ids[i : i + PAGE]).encode(), digest_size=8).digest()
            for i in range(0, len(ids) - len(ids) % PAGE, PAGE)
        ),
        len(ids),
    )


class CacheDiagnostics:
    """The fingerprints of the latest requests that opted in, by their reply's id."""

    def __init__(self, capacity: int = KEPT):
        self.capacity = capacity
        self._kept: OrderedDict[str, Fingerprint] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, message_id: str, seen: Fingerprint) -> None:
        with self._lock:
            self._kept[message_id] = seen
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def diagnose(self, previous: str | None, now: Fingerprint) -> dict[str, Any] | None:
        """The reply's `diagnostics` (None: nothing to say: no previous message named, or no miss)."""
        if previous is None:
            return None
        with self._lock:
            before = self._kept.get(previous)
        if before is None:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        shared = 0
        while shared < min(len(before.pages), len(now.pages)) and before.pages[shared] == now.pages[shared]:
            shared += 1
        missed = before.tokens - shared * PAGE
        if missed <= 2 * PAGE:  # (where the earlier prompt's generation prompt ends, the two may part)
            return None
        missed = {"cache_missed_input_tokens": missed}
        appended = before.messages == now.messages[: len(before.messages)]
        for kind, changed in (
            ("model_changed", before.model != now.model),
            ("system_changed", before.system != now.system),
            ("tools_changed", before.tools != now.tools),
            ("messages_changed", not appended),
        ):
            if changed:
                return {"cache_miss_reason": {"type": kind, **missed}}
        return {"cache_miss_reason": {"type": "unavailable"}}


def _hash(value: Any) -> str:
    """A hash of the value as the prompt reads it (cache_control marks left out)."""
    text = json.dumps(_unmarked(value), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value
