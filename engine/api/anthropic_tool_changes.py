"""Anthropic's mid-conversation tool changes: `tool_addition` and `tool_removal` content blocks (the
inline-tools beta). Claude Code loads deferred and MCP tools mid-session with them, so from its second
request on a session's messages hold them; each was a 400 here.

* `tool_addition` with `{"type": "tool_reference", "name": ...}`: a declared tool (typically
  `defer_loading: true`, kept out of the prompt's tool list) is offered from this point: its definition is
  written in place, as a tool_result's `tool_reference` loads one (engine/api/anthropic_tools.py), so the
  prompt before it, and its cached prefix, stay as they were.
* `tool_addition` with `{"type": "tool_definition", "definition": {...}}`: a tool defined inline (any entry
  `tools` takes); it is declared for the whole request (its calls parsed and typed like any other) and
  written in place like a deferred one.
* `tool_removal` with a `tool_reference`: the tool is no longer offered; a line in place tells the model.
* `mcp_tool_reference` / `mcp_toolset_reference` point into Anthropic's MCP connector, which this server does
  not run: refused in one line, as an `mcp_toolset` tool is.
"""

from __future__ import annotations

from typing import Any

from engine.api.errors import ApiError

CHANGES = ("tool_addition", "tool_removal")
_MCP = ("mcp_tool_reference", "mcp_toolset_reference")


def inline_definitions(messages: Any) -> list[tuple[str, dict[str, Any]]]:
    """(where, the tools entry) of each tool a `tool_addition` block defines inline, in message order."""
    found = []
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict) or block.get("type") != "tool_addition":
                continue
            tool = _tool(block, f"messages[{i}].content[{j}]")
            if tool.get("type") == "tool_definition":
                where = f"messages[{i}].content[{j}].tool.definition"
                if not isinstance(tool.get("definition"), dict):
                    raise ApiError(400, f"'{where}' must be a tool object, as a 'tools' entry is")
                found.append((where, tool["definition"]))
    return found


def change_text(block: dict, where: str, loaded) -> str:
    """A change block as the model reads it in place; `loaded(name, where)` writes a declared tool's
    definition (AnthropicTools.loaded)."""
    tool = _tool(block, where)
    kind = tool.get("type")
    if kind in _MCP:
        raise ApiError(
            400,
            f"{where}.tool is an {kind}, a reference into Anthropic's MCP connector, which this server does not "
            "run; declare the MCP server's tools in 'tools' (your client runs them) and refer to them by name",
        )
    if kind == "tool_definition":
        definition = tool.get("definition")
        name = definition.get("name") if isinstance(definition, dict) else None
    elif kind == "tool_reference":
        name = tool.get("name")
    else:
        raise ApiError(400, f"{where}.tool.type must be tool_reference or tool_definition (got {kind!r})")
    if not isinstance(name, str):
        raise ApiError(400, f"{where}.tool needs the tool's string 'name'")
    if block["type"] == "tool_removal":
        return f"\n(The tool {name} is no longer available.)\n"
    return "\n" + loaded(name, f"{where}.tool") + "\n"


def _tool(block: dict, where: str) -> dict[str, Any]:
    tool = block.get("tool")
    if not isinstance(tool, dict):
        raise ApiError(400, f"{where} ({block.get('type')}) needs a 'tool' object")
    return tool
