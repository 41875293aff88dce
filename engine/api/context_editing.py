"""Anthropic's context editing (`context_management.edits`, the context-management-2025-06-27 beta) on
`/v1/messages` and `/v1/messages/count_tokens`: the server clears old tool results before the prompt
reaches the model, the client keeps its full history.

`clear_tool_uses_20250919`: once the prompt passes `trigger` (input tokens, default 100,000; or a number
of tool uses), every tool use but the `keep` most recent (default 3) has its result replaced by a short
placeholder, oldest first, those of `exclude_tools` left as they are; `clear_tool_inputs` (true, or a
list of tool names) also empties the calls' inputs. The prompt is rendered again and the tokens it lost
counted exactly; fewer than `clear_at_least` and the edit is not applied (each clearing breaks the
prefix cache from the first cleared result on, so it should be worth it). `clear_thinking_20251015`
(listed first when both are) drops the thinking blocks of all but the latest `keep` assistant turns that
have any ("all", the default here, keeps them): the chat template reads an assistant turn's thinking as its
reasoning, and the Qwen templates keep it for the turns since the last user message (a tool loop) only.
`compact_20260112` is compaction, after these edits (engine/api/anthropic_compaction.py).

The response names what was applied: `context_management.applied_edits` (`cleared_tool_uses` or
`cleared_thinking_turns`, and `cleared_input_tokens`), in the final `message_delta` when streamed; count_tokens answers the edited
count with `context_management.original_input_tokens`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.api.errors import ApiError

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"  # compaction: engine/api/anthropic_compaction.py
PLACEHOLDER = "[This tool result was cleared from the context to save space.]"
PARAM = "context_management"


@dataclass(frozen=True)
class ClearToolUses:
    trigger_kind: str = "input_tokens"  # or "tool_uses"
    trigger: int = 100_000
    keep: int = 3
    clear_at_least: int = 0
    exclude: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False

    def triggered(self, input_tokens: int, tool_uses: int) -> bool:
        return (input_tokens if self.trigger_kind == "input_tokens" else tool_uses) > self.trigger

    def clear(self, body: dict) -> tuple[dict, int] | None:
        """The body with the older tool uses cleared, and how many; None when there is none to clear."""
        uses = tool_uses(body)
        older = uses[: max(0, len(uses) - self.keep)]
        targets = [u for u in older if u[2] not in self.exclude]
        if not targets:
            return None
        edited = {**body, "messages": copy.deepcopy(body["messages"])}
        results = result_blocks(edited)
        cleared = 0
        for i, j, name, use_id in targets:
            done = False
            result = results.get(use_id)
            if result is not None and result.get("content") != PLACEHOLDER:
                result["content"] = PLACEHOLDER
                result.pop("is_error", None)
                done = True
            inputs = self.clear_inputs is True or (
                isinstance(self.clear_inputs, frozenset) and name in self.clear_inputs
            )
            call = edited["messages"][i]["content"][j]
            if inputs and call.get("input"):
                call["input"] = {}
                done = True
            cleared += done
        return (edited, cleared) if cleared else None

    def applied(self, cleared: int, tokens: int) -> dict[str, Any]:
        return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": cleared, "cleared_input_tokens": tokens}


@dataclass(frozen=True)
class ClearThinking:
    """`clear_thinking_20251015`: the thinking blocks of all but the latest `keep` assistant turns that have
    any (None: all kept) are dropped. What the model read of them: the chat template's reasoning of the
    turns since the last user message (a tool loop), so older turns' thinking clears no tokens."""

    keep: int | None = None
    clear_at_least: ClassVar[int] = 0  # (apply's test: any clearing is taken)

    def triggered(self, input_tokens: int, tool_uses: int) -> bool:
        return True

    def clear(self, body: dict) -> tuple[dict, int] | None:
        """The body without the older turns' thinking blocks, and how many turns; None when none is."""
        turns = [
            i
            for i, m in enumerate(body.get("messages") or [])
            if isinstance(m, dict)
            and m.get("role") == "assistant"
            and isinstance(m.get("content"), list)
            and any(_is_thinking(b) for b in m["content"])
        ]
        older = turns[: max(0, len(turns) - self.keep)] if self.keep is not None else []
        if not older:
            return None
        messages = list(body["messages"])
        for i in older:
            messages[i] = {
                **messages[i],
                "content": [b for b in messages[i]["content"] if not _is_thinking(b)],
            }
        return {**body, "messages": messages}, len(older)

    def applied(self, cleared: int, tokens: int) -> dict[str, Any]:
        return {"type": CLEAR_THINKING, "cleared_thinking_turns": cleared, "cleared_input_tokens": tokens}


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")


def tool_uses(body: dict) -> list[tuple[int, int, str, Any]]:
    """(message index, block index, tool name, id) of every tool_use block, in order."""
    out = []
    for i, m in enumerate(body.get("messages") or []):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list) or m.get("role") != "assistant":
            continue
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out.append((i, j, block.get("name"), block.get("id")))
    return out


def result_blocks(body: dict) -> dict[Any, dict]:
    """The tool_result blocks of the user messages by their tool_use_id."""
    out = {}
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and m.get("role") == "user":
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out[block.get("tool_use_id")] = block
    return out


def parse(body: dict) -> list[ClearThinking | ClearToolUses]:
    """The request's clearing edits, in order (none without `context_management`); a malformed one is a
    400 naming the field."""
    cm = body.get(PARAM)
    if cm is None:
        return []
    if not isinstance(cm, dict) or not isinstance(cm.get("edits", []), list):
        raise ApiError(400, f"'{PARAM}' must be an object with an 'edits' array", PARAM)
    edits = cm.get("edits", [])
    kinds = [e.get("type") if isinstance(e, dict) else None for e in edits]
    for k, kind in enumerate(kinds):
        if kind not in (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT):
            raise ApiError(
                400,
                f"{PARAM}.edits[{k}].type must be '{CLEAR_TOOL_USES}', '{CLEAR_THINKING}' or '{COMPACT}' "
                f"(got {kind!r})",
                PARAM,
            )
    both = CLEAR_THINKING in kinds and CLEAR_TOOL_USES in kinds
    if both and kinds.index(CLEAR_THINKING) > kinds.index(CLEAR_TOOL_USES):
        raise ApiError(400, f"{PARAM}.edits: '{CLEAR_THINKING}' must be listed first", PARAM)
    out = []
    for k, edit in enumerate(edits):
        where = f"{PARAM}.edits[{k}]"
        if edit["type"] == COMPACT:
            continue  # engine/api/anthropic_compaction.py
        if edit["type"] == CLEAR_THINKING:
            keep = edit.get("keep", "all")
            kept = None if keep == "all" else _amount(keep, "thinking_turns", f"{where}.keep", minimum=1)
            out.append(ClearThinking(kept))
            continue
        trigger = edit.get("trigger") or {"type": "input_tokens", "value": 100_000}
        kind = trigger.get("type") if isinstance(trigger, dict) else None
        if kind not in ("input_tokens", "tool_uses"):
            raise ApiError(400, f"{where}.trigger.type must be 'input_tokens' or 'tool_uses'", PARAM)
        exclude = edit.get("exclude_tools") or []
        inputs = edit.get("clear_tool_inputs", False)
        if not isinstance(exclude, list) or not all(isinstance(n, str) for n in exclude):
            raise ApiError(400, f"{where}.exclude_tools must be an array of tool names", PARAM)
        if not isinstance(inputs, bool) and not (
            isinstance(inputs, list) and all(isinstance(n, str) for n in inputs)
        ):
            raise ApiError(
                400, f"{where}.clear_tool_inputs must be true, false or an array of tool names", PARAM
            )
        out.append(
            ClearToolUses(
                trigger_kind=kind,
                trigger=_amount(trigger, kind, f"{where}.trigger"),
                keep=_amount(
                    edit.get("keep") or {"type": "tool_uses", "value": 3}, "tool_uses", f"{where}.keep"
                ),
                clear_at_least=_amount(edit["clear_at_least"], "input_tokens", f"{where}.clear_at_least")
                if edit.get("clear_at_least") is not None
                else 0,
                exclude=frozenset(exclude),
                clear_inputs=inputs if isinstance(inputs, bool) else frozenset(inputs),
            )
        )
    return out


def _amount(value: Any, kind: str, where: str, minimum: int = 0) -> int:
    """{"type": kind, "value": N} -> N."""
    ok = isinstance(value, dict) and value.get("type") == kind
    n = value.get("value") if ok else None
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ApiError(400, f'{where} must be {{"type": "{kind}", "value": N}} with N >= {minimum}', PARAM)
    return n


def apply(body: dict, edits: list[ClearThinking | ClearToolUses], render) -> tuple[tuple, list[dict], int]:
    """(the rendering of the body as the model sees it, the applied edits, the input tokens before them).
    `render(body)` is the rendered prompt: a tuple whose second item is its token ids."""
    rendered = render(body)
    original = current = len(rendered[1])
    applied = []
    for edit in edits:
        if not edit.triggered(current, len(tool_uses(body))):
            continue
        result = edit.clear(body)
        if result is None:
            continue
        edited, cleared = result
        candidate = render(edited)
        tokens = len(candidate[1])
        if current - tokens < edit.clear_at_least:
            continue  # not worth breaking the prefix cache for
        applied.append(edit.applied(cleared, current - tokens))
        body, rendered, current = edited, candidate, tokens
    return rendered, applied, original
