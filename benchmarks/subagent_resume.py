"""What the host tier's state snapshots (`--host-state-snapshots`) save an agent and its subagents at one
request: the prompt tokens each turn computes, same process, side by side.

A hybrid model (Qwen3.5) resumes a cached prefix only where it kept its recurrent state. An agent that
hands tasks to subagents (Claude Code's Task tool) runs conversations whose turns alternate, all after
the same tool list: the main one (its system prompt with a session's environment block) and each
subagent's (a system prompt of its own). Each turn's reply is rendered back as text, so a turn resumes at
most where its conversation's last prompt ended. Their snapshots (the tool list's end, each prompt's end,
each reply's last page, every 4,096 prompt tokens) outnumber the default 4 GPU slots at one request:

    off                 --host-state-snapshots 0: the other conversations' snapshots evict a turn's
    4                   as many as the GPU slots: those evicted are copied to host memory and back when
                        their conversation's next turn comes (interval points are not kept there)
    default             three times the GPU slots (12 at one request)

With `--runs K` the turns come as an agent's do when it waits for a subagent (Claude Code's Task tool is a
blocking call): two agent turns, then subagent 1's K turns in a row, two agent turns, subagent 2's K, and
so on, the agent's last two turns at the end. The rows are then the default tier with and without
superseding (engine/cache/state_pool.py: a conversation's next turn sends the snapshots of its turn before
to the front of the eviction order, in both tiers; without it, plain LRU order, the subagent's own older
turns push out the waiting agent's last snapshot and the agent computes its conversation again from the
tool list).

The model is benchmarks/snapshot_hints.py's tiny random Qwen3.5 at a real layout's token counts (a byte
tokenizer: a token a byte); tokens computed do not depend on the machine, which is why they are the figure.

    python benchmarks/subagent_resume.py [--subagents 2] [--tools-tokens 10000] [--system-tokens 3000]
                                         [--turns 4] [--runs K]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from snapshot_hints import CONFIG, TOOLS_FIRST, agent, agent_turn, words

from engine import LLM


def order(args) -> list[str]:
    """Which conversation each turn is: round robin, or (--runs K) the agent's two turns around each
    subagent's K in a row."""
    subagents = [f"subagent {i + 1}" for i in range(args.subagents)]
    if not args.runs:
        return ["agent", *subagents] * args.turns
    turns = ["agent", "agent"]
    for who in subagents:
        turns += [who] * args.runs + ["agent", "agent"]
    return turns


def run(
    host: int | None, args, path: Path, template: Path, supersede: bool = True
) -> tuple[dict[str, list[int]], int, int]:
    """(tokens computed by turn, per conversation; prompt tokens computed again for want of a snapshot;
    the host tier's snapshot slots)."""
    llm = LLM(
        f"dummy:{path}:bf16",
        chat_template=str(template),
        max_concurrency=1,
        host_state_snapshots=host,
        max_context=65536,
        kv_capacity=131072,
    )
    if not supersede:  # plain LRU order (shared snapshots last) in both tiers
        llm.scheduler.state_pool.supersede = lambda owner, after, keep_shared=False: None
    rng = random.Random(0)
    tools, stable, environment = agent(rng, args.tools_tokens, args.system_tokens)
    conversations = {"agent": [{"role": "system", "content": f"{stable}\n{environment('ada')}"}]}
    for i in range(args.subagents):
        system = words(rng, args.system_tokens // (2 + i))
        conversations[f"subagent {i + 1}"] = [{"role": "system", "content": system}]
    computed: dict[str, list[int]] = {who: [] for who in conversations}
    for conversation in conversations.values():
        conversation.append({"role": "user", "content": words(rng, 200)})
    for who in order(args):
        result = words(rng, args.result_tokens)
        computed[who].append(agent_turn(llm, tools, conversations[who], True, result))
    host_slots = llm.scheduler.state_pool.host.num_slots if llm.scheduler.state_pool.host else 0
    return computed, llm.scheduler.num_state_lost_tokens, host_slots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subagents", type=int, default=2, help="subagents alternating with the agent")
    ap.add_argument("--tools-tokens", type=int, default=10000)
    ap.add_argument("--system-tokens", type=int, default=3000)
    ap.add_argument("--result-tokens", type=int, default=1500, help="each tool result")
    ap.add_argument("--turns", type=int, default=4, help="turns of each conversation, alternating")
    ap.add_argument("--runs", type=int, default=0, help="each subagent's turns in a row, K (0: alternating)")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "template.jinja").write_text(TOOLS_FIRST)
    how = (
        f"each subagent's {args.runs} turns in a row" if args.runs else f"alternating {args.turns} turns each"
    )
    print(
        f"tiny Qwen3.5 (dummy weights, byte tokenizer), {args.tools_tokens:,}-token tool list, an agent and "
        f"{args.subagents} subagents, {how}, {args.result_tokens:,}-token tool results; max_concurrency 1, "
        "4 GPU snapshot slots (the default), snapshots every 4,096 tokens"
    )
    print(
        "| host tier | conversation | tokens computed by turn | all | computed again for want of a snapshot |"
    )
    print("|---|---|---|---:|---:|")
    rows = [("off", 0, True), ("4 snapshots", 4, True), ("default", None, True)]
    if args.runs:
        rows = [("default, LRU order", None, False), ("default", None, True)]
    for label, host, supersede in rows:
        computed, lost, slots = run(host, args, folder / "config.json", folder / "template.jinja", supersede)
        total = sum(sum(turns) for turns in computed.values())
        for i, (who, turns) in enumerate(computed.items()):
            name = f"{label} ({slots} snapshots)" if label.startswith("default") else label
            tail = f"{total:,} | {lost:,}" if i == 0 else " | "
            print(f"| {name if i == 0 else ''} | {who} | {', '.join(f'{n:,}' for n in turns)} | {tail} |")


if __name__ == "__main__":
    main()
