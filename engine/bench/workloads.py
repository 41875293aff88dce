"""Benchmark prompts built to an exact token count, each opening with a unique nonce (a cold prefix cache).

Scenarios:
* random: random English-like words;
* coding: a long real source file (Python's own standard library, a fixed file list) and an edit request;
* agent: a system prompt, tool definitions, and turns of tool calls with JSON results, then a question (the
  nonce also opens the first tool's description, for templates that write the tools first).

One part of each prompt (the filler) is cut to length: its character count is searched (secant steps to
bracket the target, then bisection) until the counted tokens of the whole chat prompt equal the target.
`count` is the model's own tokenizer in process, or the server's count endpoint over HTTP.

An agent conversation goes on turn by turn (`next_turn`, `ninfer bench --turns`): each turn appends the
model's tool call and the tool's result, cut so the conversation grows by exactly TURN_TOKENS, and is sent
again whole, as an agent sends it; the prefix cache should serve all but the new part.
"""

from __future__ import annotations

import json
import random
import sysconfig
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import NinferError

SCENARIOS = ("random", "coding", "agent")
TURN_TOKENS = 1024  # what each agent turn after the first adds: a tool call and its result
CODING_FILES = (
    "argparse.py",
    "inspect.py",
    "typing.py",
    "dataclasses.py",
    "difflib.py",
    "ast.py",
    "functools.py",
    "statistics.py",
    "textwrap.py",
)
WORDS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    for name, desc, props in (
        ("read_file", "Read a file of the repository.", {"path": {"type": "string"}}),
        ("grep", "Search the repository for a regular expression.", {"pattern": {"type": "string"}}),
        ("run_tests", "Run the test suite and report failures.", {"selector": {"type": "string"}}),
    )
]
Messages = list[dict[str, Any]]


def _tools(head: str) -> list[dict]:
    """TOOLS, the first one's description opening with the nonce: a template that writes the tools before
    the system prompt (Qwen3.5's) must not open every agent prompt with the same cached tool list (a
    server that snapshots a hybrid model's state at the tool list's end, as ninfer does, would serve it)."""
    first = TOOLS[0]["function"]
    return [{**TOOLS[0], "function": {**first, "description": head + first["description"]}}, *TOOLS[1:]]


Counter = Callable[[Messages, list | None], int]


@dataclass(frozen=True)
class Prompt:
    messages: Messages
    tools: list | None
    tokens: int  # as counted
    nonce: str


def _stdlib_source() -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [
        f"# file: {n}\n{(root / n).read_text(encoding='utf-8')}" for n in CODING_FILES if (root / n).is_file()
    ]
    return "\n\n".join(parts)


def _random_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _agent_results(seed: int, chars: int) -> list[str]:
    """JSON tool results, enough of them to hold `chars` characters."""
    rng = random.Random(seed)
    out, size, i = [], 0, 0
    while size < chars:
        files = [
            {
                "path": f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{j}.py",
                "line": rng.randint(1, 900),
                "match": f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}(self, {rng.choice(WORDS)}):",
            }
            for j in range(40)
        ]
        text = json.dumps({"call": i, "matches": files, "truncated": False})
        out.append(text)
        size, i = size + len(text), i + 1
    return out


class Scenario:
    """The messages of a scenario with the filler cut to `n` characters."""

    def __init__(self, name: str, nonce: str, seed: int, max_chars: int):
        if name not in SCENARIOS:
            raise NinferError(f"unknown scenario '{name}'; use one of {', '.join(SCENARIOS)}")
        self.name, self.nonce = name, nonce
        if name == "random":
            self.source = _random_text(seed, max_chars // 5 + 16)
        elif name == "coding":
            text = _stdlib_source()
            self.source = (text * (1 + max_chars // max(len(text), 1)))[: max_chars + 1]
        else:
            self.results = _agent_results(seed, max_chars)
            self.source = "\n".join(self.results)
        self.max_chars = len(self.source)

    def messages(self, n: int) -> tuple[Messages, list | None]:
        # the nonce first: a page of a byte-level tokenizer's 16 tokens after the template's role line holds
        # seven of its characters ("[bench " first left one, and two prompts 1 in 16 shared their first page)
        head = f"[{self.nonce} bench] "
        filler = self.source[:n]
        if self.name == "random":
            return [
                {"role": "system", "content": head + "You are a helpful assistant."},
                {"role": "user", "content": f"{filler}\n\nContinue the list of words above."},
            ], None
        if self.name == "coding":
            return [
                {"role": "system", "content": head + "You are an expert Python programmer."},
                {
                    "role": "user",
                    "content": f"```python\n{filler}\n```\n\nRename every helper function above that starts "
                    "with an underscore so that it no longer does, and show the changed lines.",
                },
            ], None
        return self._agent_messages(head, filler), _tools(head)

    def _agent_messages(self, head: str, filler: str) -> Messages:
        msgs: Messages = [
            {"role": "system", "content": head + "You are a coding agent. Use the tools to answer."},
            {"role": "user", "content": "Where is the configuration parsed, and which tests cover it?"},
        ]
        pos = 0
        for i, result in enumerate(self.results):
            if pos >= len(filler):
                break
            piece = filler[pos : pos + len(result) + 1]
            pos += len(result) + 1
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "grep", "arguments": json.dumps({"pattern": f"config_{i}"})},
            }
            msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": piece})
        msgs.append({"role": "user", "content": "Summarise what you found in three sentences."})
        return msgs


def build(scenario: str, target: int, count: Counter, seed: int = 0, nonce: str | None = None) -> Prompt:
    """A prompt of `scenario` counting exactly `target` tokens (the nearest below when the tokenizer jumps)."""
    nonce = nonce or uuid.uuid4().hex[:12]
    sc = Scenario(scenario, nonce, seed, max_chars=target * 8 + 4096)

    def tokens(n: int) -> int:
        msgs, tools = sc.messages(n)
        return count(msgs, tools)

    base = tokens(0)
    if base > target:
        raise NinferError(
            f"a {scenario} prompt takes at least {base} tokens here (its messages and template); ask for "
            f"--ctx {base} or more (got {target})"
        )
    n, c = _fit(tokens, target, base, sc.max_chars)
    return Prompt(*sc.messages(n), c, nonce)


def next_turn(prompt: Prompt, turn: int, count: Counter) -> Prompt:
    """An agent conversation's request of `turn` (2, 3, ...): `prompt`, the one before, with the model's
    tool call and the tool's result appended, the result cut so the whole counts TURN_TOKENS more tokens
    (the nearest below where the tokenizer jumps); the same result for the same nonce and turn."""
    results = "\n".join(_agent_results(zlib.crc32(f"{prompt.nonce}:{turn}".encode()), TURN_TOKENS * 8))
    call = {
        "id": f"call_turn_{turn}",
        "type": "function",
        "function": {"name": "grep", "arguments": json.dumps({"pattern": f"config_turn_{turn}"})},
    }

    def messages(n: int) -> Messages:
        tool = {"role": "tool", "tool_call_id": call["id"], "content": results[:n]}
        return [*prompt.messages, {"role": "assistant", "content": "", "tool_calls": [call]}, tool]

    target = prompt.tokens + TURN_TOKENS
    n, c = _fit(
        lambda n: count(messages(n), prompt.tools), target, count(messages(0), prompt.tools), len(results)
    )
    return Prompt(messages(n), prompt.tools, c, prompt.nonce)


def _fit(tokens: Callable[[int], int], target: int, base: int, limit: int) -> tuple[int, int]:
    """The filler length n (0..`limit` characters) whose prompt counts `target` tokens, else the longest
    below it, and its count: secant steps from `base` (the count at 0, at most the target) until the
    target is bracketed or hit, then bisection."""
    lo, lo_count = 0, base  # lo_count <= target
    hi = None
    n = min(limit, max(1, (target - base) * 4))
    for _ in range(12):
        c = tokens(n)
        if c == target:
            return n, c
        if c < target:
            lo, lo_count = n, c
            if n == limit:
                break
            rate = (c - base) / n if n and c > base else 0.25
            n = min(limit, n + max(1, int((target - c) / rate)))
        else:
            hi = n
            break
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        c = tokens(mid)
        if c == target:
            return mid, c
        if c < target:
            lo, lo_count = mid, c
        else:
            hi = mid
    return lo, lo_count
