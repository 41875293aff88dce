"""Anthropic's `tools` as the chat template hears them (OpenAI function specs).

Three kinds come in: custom tools (`input_schema` given; `type` absent or "custom"); Anthropic-defined
client tools — bash, the text editor, memory — which arrive as a bare `{"type", "name"}` because Claude
knows their schema by heart, so the schema their `tool_use` input follows is written out here for a
model that does not; and server tools (web search, web fetch, code execution, ...), which Anthropic's own
servers execute: nothing here runs them, so they are refused in one line rather than offered to the model
as a tool the client then cannot answer. Anthropic's advisor tool, which Claude Code adds to every request
once a user picks an advisor model, is not offered to the model instead (the request does not need it).

Deferred loading (`defer_loading: true`, Claude Code's tool search): such a tool stays out of the prompt's
tool list until a `tool_reference` block in a tool result names it; the reference is read as the tool's
definition at that point of the conversation, so the prompt before it (and its prefix-cache hit) does
not change. With Anthropic's tool-search server tool instead, which nothing here runs, the deferred tools
are listed up front. Calls to any declared tool are parsed, loaded or not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.api.errors import ApiError
from engine.api.warn_once import warn_once


@dataclass(frozen=True)
class ClientTool:
    name: str  # the name Anthropic's API requires for this type
    description: str
    parameters: dict[str, Any]  # JSON schema of the tool_use input


def _string(what: str) -> dict[str, str]:
    return {"type": "string", "description": what}


_PATH = _string("Absolute path of the file or directory")
_VIEW_RANGE = {
    "type": "array",
    "items": {"type": "integer"},
    "minItems": 2,
    "maxItems": 2,
    "description": "view only: [first, last] line to show, counted from 1; last -1 reads to the end",
}


def _editor(commands: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": commands},
            "path": _PATH,
            "view_range": _VIEW_RANGE,
            "file_text": _string("create: the whole content of the new file"),
            "old_str": _string("str_replace: the exact text to replace; it must occur once in the file"),
            "new_str": _string("str_replace: the text that replaces old_str; insert: the text to insert"),
            "insert_line": {
                "type": "integer",
                "description": "insert: new_str goes after this line (0: at the top of the file)",
            },
        },
        "required": ["command", "path"],
    }


_EDITOR_TEXT = (
    "View, create and edit text files. view shows a file with line numbers (or lists a directory), "
    "create writes a new file, str_replace replaces one exact occurrence of old_str with new_str, "
    "insert adds new_str after line insert_line"
)
_EDIT_COMMANDS = ["view", "create", "str_replace", "insert"]
_OLD_EDITOR = ClientTool(
    "str_replace_editor",
    _EDITOR_TEXT + ", undo_edit reverts the last edit of path.",
    _editor([*_EDIT_COMMANDS, "undo_edit"]),
)
_EDITOR = ClientTool("str_replace_based_edit_tool", _EDITOR_TEXT + ".", _editor(_EDIT_COMMANDS))
_BASH = ClientTool(
    "bash",
    "Run a command in a persistent bash shell (the working directory and environment carry over between "
    "calls) and read its output. Set restart to true to start a fresh shell.",
    {
        "type": "object",
        "properties": {
            "command": _string("The bash command to run"),
            "restart": {"type": "boolean", "description": "true: restart the shell instead"},
        },
    },
)
_MEMORY = ClientTool(
    "memory",
    "Your memory: a directory of files under /memories that outlasts this conversation. View it before "
    "starting a task; record progress, decisions and what you learn there as you go, since the "
    "conversation may be cut short. Commands: view (a file with line numbers, or the directory), create, "
    "str_replace, insert (insert_text after line insert_line), delete, rename (old_path to new_path).",
    {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "enum": ["view", "create", "str_replace", "insert", "delete", "rename"],
            },
            "path": _string("Path under /memories"),
            "view_range": _VIEW_RANGE,
            "file_text": _string("create: the whole content of the file"),
            "old_str": _string("str_replace: the exact text to replace; it must occur once in the file"),
            "new_str": _string("str_replace: the text that replaces old_str"),
            "insert_line": {"type": "integer", "description": "insert: the line insert_text goes after"},
            "insert_text": _string("insert: the text to insert"),
            "old_path": _string("rename: the path to move"),
            "new_path": _string("rename: where it goes"),
        },
        "required": ["command"],
    },
)
CLIENT_TOOLS: dict[str, ClientTool] = {
    "bash_20241022": _BASH,
    "bash_20250124": _BASH,
    "text_editor_20241022": _OLD_EDITOR,
    "text_editor_20250124": _OLD_EDITOR,
    "text_editor_20250429": _EDITOR,
    "text_editor_20250728": _EDITOR,
    "memory_20250818": _MEMORY,
}
# the type prefixes of the tools Anthropic's servers execute (tool search apart: see the module's note)
_SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "mcp_toolset")
_TOOL_SEARCH = "tool_search_tool_"
# Anthropic's advisor (a stronger model the executor may consult mid-turn): Claude Code declares it on every
# request once a user sets an advisor model; nothing here runs it, and the request needs it not, so the
# model is not offered it (logged once) rather than every request refused
_ADVISOR = "advisor_"


@dataclass(frozen=True)
class AnthropicTools:
    specs: list[dict[str, Any]]  # every declared tool as a function spec: what calls are parsed and held to
    deferred: frozenset[str]  # names kept out of the prompt's tool list until a tool_reference loads them

    def listed(self) -> list[dict[str, Any]] | None:
        """The tools the prompt lists up front (None: none)."""
        return [s for s in self.specs if s["function"]["name"] not in self.deferred] or None

    def loaded(self, name: Any, where: str) -> str:
        """A tool_reference block's text: the named tool's definition, as the prompt's tool list has it."""
        spec = next((s for s in self.specs if s["function"]["name"] == name), None)
        if spec is None:
            raise ApiError(
                400,
                f"{where} is a tool_reference to {name!r}, which is not in tools; declare it there "
                "(defer_loading: true keeps it out of the prompt until referenced)",
            )
        return f"<tools>\n{json.dumps(spec, ensure_ascii=False)}\n</tools>"


def anthropic_tools(tools: list[Any], inline: list[tuple[str, dict]] = ()) -> AnthropicTools:
    """The request's tools as function specs for the chat template, each checked; a 400 names the first
    that cannot be served. `inline`: (where, entry) of the tools `tool_addition` blocks define in the
    messages (engine/api/anthropic_tool_changes.py): declared too, and loaded where they are added."""
    specs, deferred, searched = [], set(), False
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError(400, f"{where} must be an object", "tools")
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith(_TOOL_SEARCH):
            searched = True  # Anthropic's tool search, not run here: every tool is listed up front
            continue
        if isinstance(kind, str) and kind.startswith(_ADVISOR):
            _tell_advisor(where, kind)
            continue
        specs.append(_function(where, tool, kind))
        if tool.get("defer_loading") is True:
            deferred.add(tool["name"])
    for where, tool in inline:
        spec = _function(where, tool, tool.get("type"))
        if any(s["function"]["name"] == spec["function"]["name"] for s in specs):
            raise ApiError(400, f"'{where}' defines {spec['function']['name']!r}, a name another tool has")
        specs.append(spec)
        deferred.add(spec["function"]["name"])
    return AnthropicTools(specs, frozenset() if searched else frozenset(deferred))


def _tell_advisor(where: str, kind: str) -> None:
    warn_once(
        ("advisor", kind),
        "%s is '%s', Anthropic's advisor, which this server does not run: the model is not offered it",
        where,
        kind,
    )


def _function(where: str, tool: dict, kind: Any) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise ApiError(400, f"{where} needs a string 'name'", "tools")
    if kind in (None, "custom"):
        schema = tool.get("input_schema", {})
        if not isinstance(schema, dict):
            raise ApiError(400, f"{where}.input_schema must be a JSON schema object", "tools")
        spec = {"name": tool["name"], "description": tool.get("description", ""), "parameters": schema}
    elif kind in CLIENT_TOOLS:
        known = CLIENT_TOOLS[kind]
        if tool["name"] != known.name:
            raise ApiError(400, f"{where} of type '{kind}' must be named '{known.name}'", "tools")
        description = known.description
        if isinstance(tool.get("max_characters"), int):
            description += f" A view shows at most {tool['max_characters']} characters of a file."
        spec = {"name": known.name, "description": description, "parameters": known.parameters}
    elif isinstance(kind, str) and kind.startswith(_SERVER_TOOLS):
        raise ApiError(
            400,
            f"{where} is '{kind}', a tool Anthropic's servers run; this server runs no tools itself — remove "
            "it, or define a custom tool (name, input_schema) that your client runs",
            "tools",
        )
    else:
        raise ApiError(
            400,
            f"{where} has type {kind!r}; this server takes custom tools (name, input_schema) and Anthropic's "
            f"client tools {', '.join(CLIENT_TOOLS)}",
            "tools",
        )
    if tool.get("strict") is True:
        spec["strict"] = True  # calls held to the schema
    return {"type": "function", "function": spec}
