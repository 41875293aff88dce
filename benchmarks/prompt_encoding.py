"""What encoding an agent's prompt costs each turn: the whole rendered text encoded again (as before) against
the prompt encoder (engine/api/prompt_encoder.py: the last turn's tokens reused up to its last shared special
token, the rest encoded), side by side in one process, on the embedded model's tokenizer (byte-level BPE).

An agent's conversation grows by a tool call and its result each turn; its prompt is rendered with the chat
template and encoded before anything else runs (in a worker thread of the server). Each row: the prompt's
tokens at that turn, the milliseconds of each way (median of --repeat), their ratio; both give the same ids
(checked).

    python benchmarks/prompt_encoding.py [--tokens 32000,128000,256000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine.api.prompt_encoder import PromptEncoder
from engine.models.loader import default_model_path, open_source

TOOL_RESULT = "    def handler(self, request):\n        return self.route(request.path, request.body)\n" * 30


def conversation(tokenizer, tokens: int) -> list[dict]:
    """A system prompt and tool turns until the rendered prompt holds about `tokens` tokens."""
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools to read files. " * 40}]
    per_turn = len(tokenizer.encode(TOOL_RESULT, add_special_tokens=False)) + 40
    for i in range(max(1, tokens // per_turn)):
        messages.append({"role": "user", "content": f"Read part {i} of server.py and summarise it."})
        messages.append({"role": "assistant", "content": f"Part {i}:\n{TOOL_RESULT}"})
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="32000,128000,256000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tokenizer = open_source(default_model_path()).tokenizer
    print("| prompt tokens | encoded whole, ms | prompt encoder, ms | ratio |")
    print("|---:|---:|---:|---:|")
    for tokens in (int(t) for t in args.tokens.split(",")):
        messages = conversation(tokenizer, tokens)
        last = tokenizer.apply_chat_template(messages, None, True)
        turn = [*messages, {"role": "user", "content": "Now fix the bug in handler()."}]
        text = tokenizer.apply_chat_template(turn, None, True)
        whole, reused = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            want = tokenizer.encode(text, add_special_tokens=False)
            whole.append(time.perf_counter() - start)
            encoder = PromptEncoder(tokenizer)
            encoder.encode(last)  # the conversation's last turn, as the server saw it
            start = time.perf_counter()
            got = encoder.encode(text)
            reused.append(time.perf_counter() - start)
            assert got == want, "the prompt encoder's ids differ from the tokenizer's"
        a, b = statistics.median(whole) * 1e3, statistics.median(reused) * 1e3
        print(f"| {len(want):,} | {a:.1f} | {b:.1f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()
