"""Offline generation with the embedded default model (or a model path given as the first argument)."""

import sys

from engine import LLM, SamplingParams

llm = LLM(sys.argv[1] if len(sys.argv) > 1 else None)
reply = llm.chat(
    [{"role": "user", "content": "What is the capital of France?"}],
    SamplingParams(max_tokens=64, temperature=0.0),
)
print(reply.text)

outs = llm.generate(
    ["The three primary colors are", "def fibonacci(n):"],
    SamplingParams(max_tokens=32, temperature=0.7, top_p=0.9, seed=0, logprobs=2),
)
for out in outs:
    print(repr(out.prompt), "->", repr(out.text), out.finish_reason)
