"""Talk to `ninfer serve` with the official Anthropic SDK, including a tool round trip.

Start a server first (`ninfer serve MODEL`); the tool round trip needs a model that calls tools (Qwen3,
Qwen3.5), the embedded default just answers in text.
"""

import os

from anthropic import Anthropic

URL = os.environ.get("NINFER_URL", "http://127.0.0.1:8000")  # where `ninfer serve` listens
client = Anthropic(base_url=URL, api_key="unused-unless---api-key")
tools = [
    {
        "name": "get_weather",
        "description": "Current weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
messages = [{"role": "user", "content": "What's the weather in Paris?"}]

reply = client.messages.create(model="ninfer", max_tokens=256, tools=tools, messages=messages)
print(reply.stop_reason, [block.type for block in reply.content])
if reply.stop_reason == "tool_use":
    call = next(block for block in reply.content if block.type == "tool_use")
    print("the model asked for", call.name, call.input)
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}],
        },
    ]
    reply = client.messages.create(model="ninfer", max_tokens=256, tools=tools, messages=messages)
print(reply.content[-1].text if reply.content[-1].type == "text" else reply.content)

with client.messages.stream(
    model="ninfer", max_tokens=64, messages=[{"role": "user", "content": "Hi!"}]
) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
print()
