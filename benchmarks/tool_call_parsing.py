"""What a long tool call costs the server's event loop while it streams: the reply parser fed the call a
few characters at a time, as the engine's deltas come (engine/parsers/tool_calls.py, with and without
streaming the arguments, engine/parsers/call_stream.py), against parsing the whole reply once, same
process, side by side. The call writes a Python file through a `write_file` tool, in Qwen3's JSON form and
Qwen3.5's XML form. Median of the repeats; the streamed arguments are checked to add up to the call's.

    python benchmarks/tool_call_parsing.py [--repeat 3] [--piece 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from engine.parsers.call_stream import arguments_json
from engine.parsers.reply import ReplyParser, parse_reply
from engine.parsers.tool_calls import CLOSE, OPEN


def reply(form: str, lines: int) -> str:
    content = "".join(f'def f{i}():\n    return "{i}"\n\n' for i in range(lines // 3))
    if form == "json":
        args = json.dumps({"path": "a.py", "content": content})
        return f'Writing it.\n{OPEN}\n{{"name": "write_file", "arguments": {args}}}\n{CLOSE}'
    return (
        f"Writing it.\n{OPEN}\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
        f"<parameter=content>\n{content}\n</parameter>\n</function>\n{CLOSE}"
    )


def fed(text: str, piece: int, stream: bool) -> tuple[float, list]:
    parser, out = ReplyParser(False, [{"name": "write_file"}], stream_calls=stream), []
    t0 = time.perf_counter()
    for i in range(0, len(text), piece):
        out += parser.feed(text[i : i + piece], final=i + piece >= len(text))
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--piece", type=int, default=4, help="characters a delta (about a token's)")
    args = ap.parse_args()
    print(
        f"{'form':5} {'chars':>7} {'deltas':>7} {'whole once':>11} {'fed':>9} {'fed, streaming':>15} {'per delta':>10}"
    )
    for form in ("json", "xml"):
        for lines in (300, 1200, 4800):
            text = reply(form, lines)
            whole = statistics.median(
                timed_once(lambda text=text: parse_reply(text, False, [{"name": "write_file"}]))
                for _ in range(args.repeat)
            )
            plain = statistics.median(fed(text, args.piece, False)[0] for _ in range(args.repeat))
            runs = [fed(text, args.piece, True) for _ in range(args.repeat)]
            streaming = statistics.median(t for t, _ in runs)
            pieces = runs[0][1]
            (call,) = [v for k, v in pieces if k == "tool_call"]
            assert "".join(v for k, v in pieces if k == "tool_call_args") == arguments_json(call.arguments)
            deltas = -(-len(text) // args.piece)
            print(
                f"{form:5} {len(text):>7,} {deltas:>7,} {whole * 1e3:>9.2f}ms {plain * 1e3:>7.1f}ms "
                f"{streaming * 1e3:>13.1f}ms {streaming / deltas * 1e6:>8.1f}us"
            )


def timed_once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
