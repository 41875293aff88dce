"""What Anthropic's own servers did inside an earlier assistant turn, read back as text.

A conversation that was partly answered by Anthropic's API (a client or router that sends some turns there
and some here, a history carried over) holds its server tools' blocks in the assistant messages:
`server_tool_use` (web search, web fetch, code execution, tool search), their `*_tool_result` blocks, the MCP
connector's `mcp_tool_use` / `mcp_tool_result`, `container_upload`. Nothing here runs those tools (a request
that declares one is refused: engine/api/anthropic_tools.py), but the history is the conversation: each block
becomes lines of text in that assistant turn, so the model reads what was searched, fetched or run and what
came back (a search hit's title and address; a page's text; a program's output and exit code; an error's
code). Opaque parts (`encrypted_content`, a fetched PDF's bytes) are left out.
"""

from __future__ import annotations

import json
from typing import Any

from engine.api.errors import ApiError

CALLS = ("server_tool_use", "mcp_tool_use")
RESULTS = (
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_result",
    "advisor_tool_result",
)
BLOCKS = (*CALLS, *RESULTS, "container_upload")


def server_block_text(block: dict, where: str) -> str:
    """One of BLOCKS (from an assistant message) as the text the model reads in that turn."""
    kind = block["type"]
    if kind in CALLS:
        name, args = block.get("name"), block.get("input", {})
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ApiError(400, f"{where} ({kind}) needs a string 'name' and an object 'input'")
        server = f"{block['server_name']}." if isinstance(block.get("server_name"), str) else ""
        return f"\n[{server}{name} {json.dumps(args, ensure_ascii=False)}]\n"
    if kind == "container_upload":
        return ""
    if "content" not in block:
        raise ApiError(400, f"{where} ({kind}) needs its 'content'")
    text = _result_text(block["content"]).strip()
    label = "error" if block.get("is_error") else "result"
    return f"\n[{kind.removesuffix('_tool_result')} {label}]\n{text}\n" if text else f"\n[{kind} (empty)]\n"


def _result_text(value: Any) -> str:
    """The readable part of a server tool's result (any of the shapes Anthropic's API writes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (_result_text(v) for v in value) if t)
    if not isinstance(value, dict):
        return ""
    kind = str(value.get("type", ""))
    if kind.endswith("_error") or "error_code" in value:
        return f"error: {value.get('error_code', 'unknown')}"
    if kind == "web_search_result":
        age = f" ({value['page_age']})" if isinstance(value.get("page_age"), str) else ""
        return f"- {value.get('title', '')} <{value.get('url', '')}>{age}"
    if kind == "web_fetch_result":
        return f"{value.get('url', '')}\n{_result_text(value.get('content'))}"
    if kind == "document":
        source = value.get("source") if isinstance(value.get("source"), dict) else {}
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return source["data"]
        if source.get("type") == "content":
            return _result_text(source.get("content"))
        return f"(a {source.get('media_type') or source.get('type') or 'binary'} document, not read here)"
    if kind.endswith("code_execution_result"):
        parts = [str(value.get(key) or "").strip() for key in ("stdout", "stderr")]
        return "\n".join([*(p for p in parts if p), f"(exit code {value.get('return_code')})"])
    if kind.endswith("_create_result"):
        return "the file was updated" if value.get("is_file_update") else "the file was created"
    if kind.endswith("_str_replace_result"):
        return "\n".join(str(line) for line in value.get("lines") or []) or "the text was replaced"
    if kind.endswith("_search_result") and "tool_references" in value:
        names = [r.get("tool_name", "") for r in value["tool_references"] if isinstance(r, dict)]
        return "tools found: " + ", ".join(names)
    for key in ("text", "content"):
        if key in value:
            return _result_text(value[key])
    return ""
