"""What OpenAI's own tools did in an earlier turn of a Responses conversation, read back as text.

A conversation answered in part by OpenAI's API (a router, an agent framework that switches providers and
keeps the items) holds its hosted tools' items: `web_search_call`, `file_search_call`,
`code_interpreter_call`, `image_generation_call`, `computer_call` (and its output), `local_shell_call` /
`shell_call` / `apply_patch_call` and their outputs, `mcp_call`, `mcp_list_tools`, MCP approvals. Nothing
here runs those tools (a request that declares one is refused), but the history is the conversation: each
item becomes lines of text in the assistant's turn, so the model reads what was searched, run or changed and
what came back. Opaque parts (a generated image's bytes, a screenshot) are left out.
"""

from __future__ import annotations

import json
from typing import Any

ITEMS = (
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "computer_call",
    "computer_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
)


def hosted_item_text(item: dict[str, Any]) -> str:
    """One of ITEMS as the text the model reads in the assistant's turn ("" for one that says nothing)."""
    kind = item["type"]
    body = _body(kind, item).strip()
    return f"\n[{kind}]\n{body}\n" if body else f"\n[{kind}]\n"


def _body(kind: str, item: dict[str, Any]) -> str:
    action = item.get("action") if isinstance(item.get("action"), dict) else {}
    if kind == "web_search_call":
        sources = [s.get("url", "") for s in _dicts(action.get("sources"))]
        said = [
            f"{key}: {action[key]}" for key in ("query", "url", "pattern") if isinstance(action.get(key), str)
        ]
        return "\n".join(said + [f"- <{url}>" for url in sources])
    if kind == "file_search_call":
        queries = [f"query: {q}" for q in _list(item.get("queries")) if isinstance(q, str)]
        hits = [f"- {r.get('filename', '')}: {r.get('text', '')}" for r in _dicts(item.get("results"))]
        return "\n".join(queries + hits)
    if kind == "code_interpreter_call":
        logs = [o.get("logs", "") for o in _dicts(item.get("outputs")) if o.get("type") == "logs"]
        return "\n".join([str(item.get("code") or ""), *(str(log) for log in logs)])
    if kind in ("local_shell_call", "shell_call"):
        command = action.get("command") or action.get("commands") or []
        return " ".join(map(str, command)) if isinstance(command, list) else str(command)
    if kind == "apply_patch_call":
        op = item.get("operation") if isinstance(item.get("operation"), dict) else {}
        return "\n".join(str(op.get(key)) for key in ("type", "path", "diff") if op.get(key))
    if kind.endswith("_output"):
        return _output_text(item.get("output"))
    if kind == "mcp_call":
        call = f"{item.get('server_label', '')}.{item.get('name', '')} {item.get('arguments', '')}"
        return "\n".join(str(v) for v in (call, item.get("output"), item.get("error")) if v)
    if kind == "mcp_list_tools":
        names = [str(t.get("name", "")) for t in _dicts(item.get("tools"))]
        return f"{item.get('server_label', '')}: " + ", ".join(names)
    if kind == "computer_call":
        return json.dumps({k: v for k, v in action.items() if k != "screenshot"}, ensure_ascii=False)
    return ""  # image_generation_call (the image's bytes), MCP approvals


def _output_text(output: Any) -> str:
    """A hosted tool call's output: text, or a shell's runs (stdout, stderr, how each ended)."""
    if isinstance(output, str):
        return output
    lines = []
    for run in _dicts(output):
        lines += [str(run[key]).strip() for key in ("stdout", "stderr", "text") if run.get(key)]
        outcome = run.get("outcome")
        if isinstance(outcome, dict) and outcome.get("exit_code") is not None:
            lines.append(f"(exit code {outcome['exit_code']})")
    return "\n".join(lines)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of an array (a field of another shape: none; the items are a client's, unchecked)."""
    return [v for v in _list(value) if isinstance(v, dict)]
