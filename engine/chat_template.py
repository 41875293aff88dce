"""Chat templates rendered with jinja2 in a sandbox, with the variables transformers passes."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import NinferError
from engine.flag_json import json_object

# A refusal that guards nothing the rendering needs: the Qwen3, Qwen3.5 and Qwen3.6 templates raise it for a
# conversation without a user message, after setting their last query to the last message, which is what
# the rest of the template reads. Such conversations are sent as a matter of course: a system prompt
# alone (a summarize or classify call), an agent history whose user turn was compacted away (tool results
# after a call), a group chat's assistant turns. Rendered on, they read as they were sent (earlier turns'
# reasoning dropped, as after any user message); refused, every such client got a 400.
PASSED_REFUSALS = frozenset({"No user query found in messages."})


def _raise_exception(message: str) -> str:
    if message in PASSED_REFUSALS:
        return ""
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat_template(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """Render `messages` (and `tools`, as JSON schemas) the way transformers' apply_chat_template does.

    Extra keyword arguments (enable_thinking, bos_token, eos_token, ...) become template variables.
    """
    try:
        compiled = _compile(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise NinferError(f"the chat template does not parse (line {e.lineno}): {e.message}") from e
    try:
        return compiled.render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except jinja2.exceptions.TemplateError as e:
        raise NinferError(f"the chat template refused these messages: {e}") from e


# Qwen3.6's chat template variable: every earlier turn's reasoning kept (by default only the turns since the
# last user message keep theirs)
PRESERVE_THINKING = "preserve_thinking"


def with_kept_reasoning(
    template: str, messages: list[dict[str, Any]], variables: dict[str, Any]
) -> dict[str, Any]:
    """The template variables, with `preserve_thinking` true where the template reads it, the conversation
    sent reasoning back (an assistant turn's reasoning_content, or its content's `<think>` part) and nothing
    set it (the request's chat_template_kwargs, --chat-template-kwargs).

    NOTE: without it, a new user message drops the reasoning of every turn before it, so the rendered
    conversation stops matching what the prefix cache holds at the first assistant turn that thought, and
    all after it is computed again (a hybrid model, whose recurrent state cannot skip the dropped tokens,
    has no other way back): at each user message of a long thinking agent session, most of its context.
    Kept, the conversation only grows, as the turns the model wrote it; Qwen3.6 ships the switch for this.
    A conversation without reasoning sent back renders as before (no empty think blocks added)."""
    if PRESERVE_THINKING in variables or PRESERVE_THINKING not in template:
        return variables
    if not any(m.get("role") == "assistant" and _reasoned(m) for m in messages):
        return variables
    return {**variables, PRESERVE_THINKING: True}


# the reasoning efforts the protocols send, least to most (OpenAI's none .. xhigh, Anthropic's low .. max)
EFFORT_SCALE = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
REASONING_EFFORT = "reasoning_effort"


def with_taken_effort(template: str, variables: dict[str, Any]) -> dict[str, Any]:
    """The template variables, with a `reasoning_effort` the template refuses replaced by the nearest one it
    takes (a tie: the higher). Qwen3.8's template takes xhigh (its default), medium and low and raises for
    any other, so Claude Code's `high` or Codex's `high` would have been a 400 on every request; it now
    thinks at xhigh. A template that reads no effort, or takes this one, gets it as sent."""
    effort = variables.get(REASONING_EFFORT)
    if effort not in EFFORT_SCALE or REASONING_EFFORT not in template or _takes_effort(template, effort):
        return variables
    taken = [e for e in EFFORT_SCALE if _takes_effort(template, e)]
    if not taken:  # (the template refuses the probe itself: nothing learned)
        return variables
    rank = EFFORT_SCALE.index(effort)
    nearest = min(taken, key=lambda e: (abs(EFFORT_SCALE.index(e) - rank), -EFFORT_SCALE.index(e)))
    return {**variables, REASONING_EFFORT: nearest}


@lru_cache(maxsize=256)
def _takes_effort(template: str, effort: str) -> bool:
    """The template renders a one-question conversation, thinking on, at this effort."""
    try:
        render_chat_template(
            template,
            [{"role": "user", "content": "?"}],
            None,
            True,
            enable_thinking=True,
            reasoning_effort=effort,
        )
    except NinferError:
        return False
    return True


def _reasoned(message: dict[str, Any]) -> bool:
    """An assistant turn that carries its reasoning: as reasoning_content, or in its content before
    `</think>` (as `ninfer chat` keeps a reply; the Qwen templates split it there)."""
    content = message.get("content")
    return bool(message.get("reasoning_content")) or (isinstance(content, str) and "</think>" in content)


def with_system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The conversation with one system message, first, for templates that take no other (Qwen3.5's and
    Qwen3.6's raise "System message must be at the beginning."): the leading system messages folded into
    one, and a later one (a client's hook context, an OpenAI `developer` message mid-conversation) made a
    user message in place — not moved to the start, which would change the prompt's head, and with it the
    prefix cache, every time one is added. None where there is nothing to change."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    later = any(m.get("role") == "system" for m in messages[lead:])
    if lead < 2 and not later:
        return None
    head = [_folded(messages[:lead])] if lead else []
    rest = [{**m, "role": "user"} if m.get("role") == "system" else m for m in messages[lead:]]
    return head + rest


def _folded(systems: list[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive system messages as one: their texts (or parts) in order, a blank line between."""
    contents = [m.get("content") for m in systems]
    if all(isinstance(c, str) for c in contents):
        return {**systems[0], "content": "\n\n".join(c for c in contents if c)}
    parts: list[Any] = []
    for c in contents:
        more = [{"type": "text", "text": c}] if isinstance(c, str) else list(c or ())
        if parts and more:
            parts.append({"type": "text", "text": "\n\n"})
        parts += more
    return {**systems[0], "content": parts}


# variables the renderer sets itself: a default for one of them would be ignored or clash
RENDER_VARIABLES = (
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
)


def parse_template_kwargs(value: Any) -> tuple[tuple[str, Any], ...]:
    """`--chat-template-kwargs` (vLLM's --default-chat-template-kwargs, llama-server's --chat-template-kwargs):
    a JSON object (or a dict) of chat template variables every request renders with unless its own
    chat_template_kwargs (or thinking switch) says otherwise, e.g. {"enable_thinking": false}; kept as
    (name, value) pairs."""
    if value is None or value == ():
        return ()
    if isinstance(value, tuple):
        return value
    value = json_object(value, "--chat-template-kwargs", '{"enable_thinking": false}')
    clash = [name for name in value if name in RENDER_VARIABLES]
    if clash:
        raise NinferError(
            f"--chat-template-kwargs sets {', '.join(clash)}, which the renderer sets itself from the request "
            "and the tokenizer; drop it"
        )
    return tuple(value.items())
