"""What a hybrid model's snapshot hints save a new agent session: the prompt tokens it computes when another
session of the same agent ran before it, same process, side by side.

A hybrid model (Qwen3.5) resumes a cached prefix only where it kept its recurrent state. An agent's
requests: a tool list (Qwen3.5's template writes it before the system prompt), a system prompt ending in
a per-session environment block (a working directory, a date, a git status), then the conversation.
Session A runs `--turns` turns (each a reply and a tool result, the reply rendered back as text); then
session B starts, its environment another. Three ways, at 2 snapshot slots (the default before) and 4
(`--state-snapshots`; now the default at one request, 2 x 1 + 2), the GPU slots alone (no host tier,
`--host-state-snapshots 0`; benchmarks/subagent_resume.py measures that tier):

    no hints, LRU       the engine's own snapshot points, evicted least recently used first
    hints, LRU          the tool list's end a snapshot point too (engine/api/snapshot_hints.py)
    hints, shared last  and the snapshots other sessions resume from evicted last (StatePool._victim)

The model is a tiny random Qwen3.5 at a real layout's token counts (`dummy:` weights, a byte tokenizer:
a token a byte); tokens computed do not depend on the machine, which is why they are the figure.

    python benchmarks/snapshot_hints.py [--tools-tokens 10000] [--system-tokens 3000] [--turns 4]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from engine import LLM, SamplingParams
from engine.api import snapshot_hints

TOOLS_FIRST = """{%- if tools %}<|im_start|>system
# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>{% if messages[0].role == 'system' %}

{{ messages[0].content }}{% endif %}<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}<|im_start|>assistant
"""
CONFIG = {  # a tiny Qwen3.5 (3 Gated DeltaNet layers, 1 attention layer)
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,
    "eos_token_id": 2,
}
WORDS = (
    "read",
    "write",
    "search",
    "file",
    "path",
    "line",
    "pattern",
    "return",
    "value",
    "option",
    "the",
    "of",
)


def words(rng: random.Random, n: int) -> str:
    """About n bytes of words."""
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < n:
        out.append(rng.choice(WORDS))
    return " ".join(out)


def agent(rng: random.Random, tools_tokens: int, system_tokens: int):
    """(the tools, the system prompt's stable part, a session's environment block given its name)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool{i}",
                "description": words(rng, tools_tokens // 15 - 60),
                "parameters": {},
            },
        }
        for i in range(15)
    ]
    stable = words(rng, system_tokens)

    def environment(session: str) -> str:
        return (
            f"<env>cwd: /home/{session}/project\ndate: 2026-12-0{len(session)}\ngit: {session}-branch</env>"
        )

    return tools, stable, environment


def ask_agent(llm: LLM, tools: list[dict], messages: list[dict], hinted: bool) -> tuple[int, int, list[int]]:
    """(tokens computed, prompt tokens, reply ids) of one request, alone on the engine; `hinted`: with the
    tool list's end as a snapshot hint, as the chat routes give it."""
    tok = llm.tokenizer
    text = tok.apply_chat_template(messages, tools)
    ids = tok.encode(text, add_special_tokens=False)
    renders = [lambda: tok.apply_chat_template([snapshot_hints.PLACEHOLDER], tools)]
    hints = snapshot_hints.hints(text, ids, renders, tok) if hinted else ()
    request_id = llm.add_request(
        ids, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True), snapshot_hints=hints
    )
    while True:
        done = [o for o, _ in llm.step() if o.request_id == request_id and o.finished]
        if done:
            return len(ids) - done[0].num_cached_tokens, len(ids), list(done[0].token_ids)


def agent_turn(llm: LLM, tools: list[dict], conversation: list[dict], hinted: bool, result: str) -> int:
    """One turn of `conversation` (ask_agent), then its reply rendered back as text and `result`, the next
    user message, appended to it: the tokens the turn computed."""
    computed, _, reply = ask_agent(llm, tools, conversation, hinted)
    conversation += [
        {"role": "assistant", "content": llm.tokenizer.decode(reply)},
        {"role": "user", "content": result},
    ]
    return computed


def run(mode: str, snapshots: int, args, path: Path, template: Path) -> tuple[list[int], int, int]:
    """(session A's computed tokens by turn, session B's computed tokens, B's prompt tokens)."""
    llm = LLM(
        f"dummy:{path}:bf16",
        chat_template=str(template),
        max_concurrency=1,
        state_snapshots=snapshots,
        host_state_snapshots=0,
        max_context=65536,
        kv_capacity=131072,
    )
    if mode.endswith("LRU"):  # least recently used first, whatever the snapshot
        pool = llm.scheduler.state_pool
        pool._victim = lambda idle_only=False: next(
            (h for h, s in pool.snapshots.items() if s not in pool._pinned), None
        )
    rng = random.Random(0)
    tools, stable, environment = agent(rng, args.tools_tokens, args.system_tokens)
    hinted = not mode.startswith("no hints")

    def ask(messages: list[dict]) -> tuple[int, int, list[int]]:
        return ask_agent(llm, tools, messages, hinted)

    def system(session: str) -> dict:
        return {"role": "system", "content": f"{stable}\n{environment(session)}"}

    conversation = [system("ada"), {"role": "user", "content": words(rng, 200)}]
    computed_a = []
    for _ in range(args.turns):
        computed_a.append(agent_turn(llm, tools, conversation, hinted, words(rng, args.result_tokens)))
    computed_b, prompt_b, _ = ask([system("bob"), {"role": "user", "content": words(rng, 200)}])
    return computed_a, computed_b, prompt_b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools-tokens", type=int, default=10000)
    ap.add_argument("--system-tokens", type=int, default=3000)
    ap.add_argument("--result-tokens", type=int, default=1500, help="each tool result in session A")
    ap.add_argument("--turns", type=int, default=4, help="session A's turns before session B starts")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "template.jinja").write_text(TOOLS_FIRST)
    print(
        f"tiny Qwen3.5 (dummy weights, byte tokenizer), {args.tools_tokens:,}-token tool list, "
        f"{args.system_tokens:,}-token system prompt, session A {args.turns} turns, then session B; "
        "max_concurrency 1, snapshots every 4,096 tokens"
    )
    print(
        "| snapshot slots | hints, eviction | A's turns: tokens computed | B: tokens computed of its prompt |"
    )
    print("|---|---|---|---|")
    for snapshots in (2, 4):
        for mode in ("no hints, LRU", "hints, LRU", "hints, shared last"):
            a, b, prompt_b = run(mode, snapshots, args, folder / "config.json", folder / "template.jinja")
            print(f"| {snapshots} | {mode} | {', '.join(f'{n:,}' for n in a)} | {b:,} of {prompt_b:,} |")


if __name__ == "__main__":
    main()
