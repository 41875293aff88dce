"""What a compaction asks of the model: the request, after the conversation, for a summary to go on from.
Shared by the server's compactions (engine/api/response_compaction.py, anthropic_compaction.py) and
`ninfer chat`'s /compact."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INSTRUCTION = (
    "Your context is nearly full, so this conversation is being compacted. Write a summary that lets you "
    "go on with the task from it alone: the user's goals and requirements, what has been done and found "
    "(files, commands, results, decisions and why), what is left to do and the next step, and anything "
    "else that must not be lost. Write only the summary."
)


def summary_text(summary: str, user: list[str] | tuple[str, ...] = ()) -> str:
    """A compaction as the words the model reads in place of the conversation it stands for: the summary,
    then the latest user messages it carries, as they were."""
    said = "".join(f"\n\n{u}" for u in user)
    latest = f"\n\nThe user's latest messages, as they were:{said}" if said else ""
    return f"Summary of the conversation before this point (it was compacted):\n{summary}{latest}"


def latest_within(items: list[T], tokens: Callable[[T], int], budget: int) -> list[T]:
    """The latest `items` whose `tokens` together stay within `budget`, in their order: counted from the
    last back, stopping at the first that would pass it (those before it are left out too)."""
    kept: list[T] = []
    for item in reversed(items):
        budget -= tokens(item)
        if budget < 0:
            break
        kept.append(item)
    return kept[::-1]
