"""The Responses API's tool forms beyond plain function and custom tools, as Codex sends them, read into the
flat function / custom entries the rest of the route takes (engine/api/responses.py `_tools`):

* `namespace` tools group function and custom tools: the model sees each member as `namespace.name` (the
  `functions` namespace, OpenAI's plain one, as `name`), and a call of one comes back as the member's
  `name` with its `namespace`; a call sent back with a `namespace` is read the same way.
* `additional_tools` input items (Codex 0.150 on sends one, its code-mode `exec` tool in a namespace, first
  in every request's input): their tools are the request's as if in `tools`.
* a client-run `tool_search` tool (`execution: "client"`): the model sees a function of that name (its
  `parameters`, or a `query` string); its call comes back as a `tool_search_call` item, whose `arguments`
  are the object written. Function tools with `defer_loading: true` stay out of the prompt's tool list;
  a `tool_search_output` item (the client's answer) carries the tools it found, which are written where
  it stands (the prompt before it, and its cached prefix, unchanged) and may be called from there on.
  With the hosted `tool_search` (`execution: "server"`), which nothing here runs, the deferred tools are
  listed up front instead.
* tools OpenAI's servers run (`web_search`, `image_generation`, ...; Codex lists some with every request)
  are not offered to the model, logged once a type, rather than every request refused; the built-in tools
  a client runs (`local_shell`, `shell`, `apply_patch`), whose calls it would wait for, are refused in a
  line (give them as function or custom tools, as Codex does for other models).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.api.custom_tools import custom_function
from engine.api.errors import ApiError
from engine.api.warn_once import warn_once

SEARCH = "tool_search"
# the tools OpenAI's servers run (type prefixes): not offered to the model
_HOSTED = ("web_search", "image_generation", "file_search", "code_interpreter", "computer_use", "mcp")
PLAIN_NAMESPACE = "functions"
_SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "what the tool to find should do"}},
    "required": ["query"],
}


@dataclass(frozen=True)
class ToolNames:
    """How the reply's calls become output items."""

    custom: frozenset[str] = frozenset()  # the custom tools' names: custom_tool_call items
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)  # seen name -> (namespace, name)
    search: bool = False  # a call of SEARCH is a tool_search_call item


@dataclass(frozen=True)
class ResponseTools:
    flat: list[dict[str, Any]]  # every tool, as flat function / custom entries under the names the model sees
    wheres: list[str]  # where each came from in the request
    deferred: frozenset[str]  # those kept out of the prompt's tool list (loaded by a tool_search_output)
    names: ToolNames


def seen_name(namespace: Any, name: Any) -> Any:
    """The name the model sees (and writes) for a tool of `namespace` (None: none)."""
    if not isinstance(namespace, str) or not namespace or namespace == PLAIN_NAMESPACE:
        return name
    return f"{namespace}.{name}"


def response_tools(body: dict, items: Any) -> ResponseTools:
    """The request's tools (`tools`, then each `additional_tools` item's, then those `tool_search_output`
    items loaded), flattened; a 400 names the first that cannot be served."""
    flat: list[dict[str, Any]] = []
    wheres: list[str] = []
    marked: set[str] = set()  # defer_loading: true
    loaded: set[str] = set()  # known only from a tool_search_output: written where it stands
    namespaces: dict[str, tuple[str, str]] = {}
    names: set[str] = set()  # the names taken so far
    search = hosted = False
    groups = [(f"tools[{i}]", t, False) for i, t in enumerate(body.get("tools") or [])]
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("type") in ("additional_tools", "tool_search_output"):
            tools = item.get("tools")
            if not isinstance(tools, list):
                raise ApiError(400, f"input[{i}].tools must be an array of tools", "input")
            found = item["type"] == "tool_search_output"
            groups += [(f"input[{i}].tools[{j}]", t, found) for j, t in enumerate(tools)]
    for where, tool, found in groups:
        if not isinstance(tool, dict):
            raise ApiError(400, f"{where} must be an object", "tools")
        kind = tool.get("type")
        if kind == SEARCH:
            client = tool.get("execution", "server") == "client"
            search, hosted = search or client, hosted or not client
            if client and SEARCH not in names:
                flat.append(_search_function(tool, where))
                wheres.append(where)
                names.add(SEARCH)
            continue
        if isinstance(kind, str) and kind.startswith(_HOSTED):
            _pass_over(where, kind)
            continue
        if kind not in ("function", "custom", "namespace"):  # (local_shell, shell, apply_patch: the client's)
            raise ApiError(
                400,
                f"{where} is a '{kind}' tool; this server takes function, custom and namespace tools (the "
                "client runs them) — give it as a function or custom tool",
                "tools",
            )
        members = _members(tool, where) if kind == "namespace" else [(None, tool, where)]
        for namespace, member, at in members:
            name = member.get("name")
            if not isinstance(name, str) or not name:
                raise ApiError(400, f"{at} needs a string 'name'", "tools")
            shown = seen_name(namespace, name)
            if shown in names:
                if found:  # (a tool search may find a tool the request already has)
                    continue
                raise ApiError(400, f"{at} is named {shown!r}, as another tool is", "tools")
            flat.append({**member, "name": shown})
            wheres.append(at)
            names.add(shown)
            if namespace is not None:
                namespaces[shown] = (namespace, name)
            if found:
                loaded.add(shown)
            elif member.get("defer_loading") is True:
                marked.add(shown)
    deferred = loaded | (marked if search and not hosted else set())
    custom = frozenset(t["name"] for t in flat if t.get("type") == "custom")
    return ResponseTools(flat, wheres, frozenset(deferred), ToolNames(custom, namespaces, search))


def _pass_over(where: str, kind: Any) -> None:
    """A tool OpenAI's servers run (`web_search`, `image_generation`, `file_search`, `code_interpreter`, ...):
    Codex lists some with every request, so the model is not offered it, logged once a type, rather than
    every request refused."""
    warn_once(
        ("hosted tool", kind),
        "%s has type '%s', a tool OpenAI's servers run, which this server does not: the model is not offered it",
        where,
        kind,
    )


def _members(tool: dict, where: str) -> list[tuple[str, dict, str]]:
    """A namespace tool's members: (namespace, the member, where it is)."""
    if not isinstance(tool.get("name"), str) or not isinstance(tool.get("tools"), list):
        raise ApiError(400, f"{where} (a namespace) needs a string 'name' and a 'tools' array", "tools")
    out = []
    for j, member in enumerate(tool["tools"]):
        at = f"{where}.tools[{j}]"
        if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
            raise ApiError(400, f"{at} must be a function or custom tool (a namespace holds those)", "tools")
        out.append((tool["name"], member, at))
    return out


def _search_function(tool: dict, where: str) -> dict[str, Any]:
    parameters = tool.get("parameters") if tool.get("parameters") is not None else _SEARCH_PARAMETERS
    if not isinstance(parameters, dict):
        raise ApiError(400, f"{where}.parameters must be a JSON schema object", "tools")
    description = tool.get("description") or "Find tools by what they do; the ones found can be called next."
    return {"type": "function", "name": SEARCH, "description": description, "parameters": parameters}


def loaded_text(tools: Any, where: str) -> str:
    """A tool_search_output item's tools as the model reads them where the item stands: each definition, as
    the prompt's tool list has them."""
    specs = []
    for j, tool in enumerate(tools if isinstance(tools, list) else []):
        at = f"{where}.tools[{j}]"
        if not isinstance(tool, dict):
            raise ApiError(400, f"{at} must be an object", "input")
        kind = tool.get("type")
        if kind not in ("function", "custom", "namespace"):
            continue  # (a hosted tool: not offered)
        members = _members(tool, at) if kind == "namespace" else [(None, tool, at)]
        for namespace, member, member_at in members:
            spec = function_spec(member, member_at)
            spec["function"]["name"] = seen_name(namespace, member.get("name"))
            specs.append(spec)
    if not specs:
        return "No tools were found."
    return "<tools>\n" + "\n".join(json.dumps(s, ensure_ascii=False) for s in specs) + "\n</tools>"


def function_spec(tool: dict, where: str) -> dict[str, Any]:
    """A flat function or custom tool as the function spec the chat template lists."""
    if tool.get("type") == "custom":
        return custom_function(tool, where)
    if not isinstance(tool.get("name"), str):
        raise ApiError(400, f"{where} needs a string 'name'", "tools")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
        raise ApiError(400, f"{where}.parameters must be a JSON schema object", "tools")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}
