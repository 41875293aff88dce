"""Talk to `ninfer serve` with the official Anthropic SDK (start the server first: `ninfer serve`)."""

from anthropic import Anthropic

client = Anthropic(base_url="http://127.0.0.1:8000", api_key="unused-unless---api-key")
messages = [{"role": "user", "content": "Name three primary colors."}]

message = client.messages.create(model="ninfer", max_tokens=64, system="Be brief.", messages=messages)
print(message.content[0].text, message.stop_reason, message.usage)

with client.messages.stream(model="ninfer", max_tokens=64, messages=messages) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
print()
print("tokens:", client.messages.count_tokens(model="ninfer", messages=messages).input_tokens)
