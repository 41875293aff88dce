"""What a long new prompt costs the streams already running: one stream decodes while another client sends a
conversation of ~250K tokens that none of the server's recent prompts starts (a resumed session after a
restart, a subagent handed a repository), on the embedded default model served over HTTP in this process.

Rendering such a prompt with the chat template and encoding it takes ~0.6 s of CPU on this machine. Where
that ran on the server's event loop, the running stream's tokens (made by the engine's own thread all
along) reached its client only after it: one gap of that length in its stream. Each row: the running
stream's gaps between chunks (p50 and the longest), alone and while the long prompt is counted
(`/v1/messages/count_tokens`: rendered and encoded, nothing computed) and while it is sent to
`/v1/chat/completions` (rendered, encoded, then refused as longer than the context), and the longest gap
against the stream's p50 alone.

    python benchmarks/long_prompt_stall.py [--tokens 250000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import requests
import uvicorn

from engine.api.app import create_app
from engine.api.state import ServerState
from engine.async_llm import AsyncLLM

FILE = "    def handler(self, request):\n        return self.route(request.path, request.body)\n" * 30


def conversation(tokens: int) -> list[dict]:
    """A system prompt and tool-reading turns, ~`tokens` tokens rendered (the embedded model's tokenizer
    takes ~25 tokens a line of FILE); a random first line, so no recent prompt starts it."""
    turns = max(1, tokens // 690)
    messages = [{"role": "system", "content": f"Session {time.time_ns()}. You are a coding agent."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Read part {i} of server.py."})
        messages.append({"role": "assistant", "content": f"Part {i}:\n{FILE}"})
    messages.append({"role": "user", "content": "Now fix the bug in handler()."})
    return messages


def stream_gaps(url: str, during=None) -> list[float]:
    """The gaps (s) between a 96-token stream's chunks; `during`, if given, runs in a thread from its third
    chunk on."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count from one to a thousand."}],
        "max_tokens": 96,
        "ignore_eos": True,
        "stream": True,
    }
    gaps, last, other = [], None, None
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=120) as reply:
        for line in reply.iter_lines(decode_unicode=True):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            if during is not None and len(gaps) == 2:
                other = threading.Thread(target=during)
                other.start()
    if other is not None:
        other.join()
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    engine = AsyncLLM(None)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    app = create_app(ServerState(engine, "m", ()))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    stream_gaps(url)  # warm-up

    def count() -> None:
        system, *messages = conversation(args.tokens)
        body = {"model": "m", "system": system["content"], "messages": messages}
        reply = requests.post(f"{url}/v1/messages/count_tokens", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        print(f"  (count_tokens: {reply.json()['input_tokens']:,} tokens)")

    def chat() -> None:
        body = {"model": "m", "messages": conversation(args.tokens), "max_tokens": 8}
        reply = requests.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 400, reply.text  # longer than the context: refused once encoded

    rows = {"alone": None, "a long prompt counted": count, "a long prompt sent (refused)": chat}
    alone_p50 = None
    print("| the running stream | gap p50, ms | longest gap, ms | longest / p50 alone |")
    print("|---|---:|---:|---:|")
    for name, during in rows.items():
        p50s, longest = [], []
        for _ in range(args.repeat):
            gaps = stream_gaps(url, during)
            p50s.append(statistics.median(gaps))
            longest.append(max(gaps))
        p50, top = statistics.median(p50s) * 1e3, statistics.median(longest) * 1e3
        alone_p50 = alone_p50 or p50
        print(f"| {name} | {p50:.1f} | {top:.1f} | {top / alone_p50:.1f}x |")
    server.should_exit = True
    engine.shutdown()


if __name__ == "__main__":
    main()
