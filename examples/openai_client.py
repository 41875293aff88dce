"""Talk to `ninfer serve` with the official OpenAI SDK (start the server first: `ninfer serve`)."""

import os

from openai import OpenAI

URL = os.environ.get("NINFER_URL", "http://127.0.0.1:8000")  # where `ninfer serve` listens
client = OpenAI(base_url=f"{URL}/v1", api_key="unused-unless---api-key")
messages = [{"role": "user", "content": "What is the capital of France?"}]

reply = client.chat.completions.create(model="ninfer", messages=messages, max_tokens=64, temperature=0)
print(reply.choices[0].message.content)
print("cached prompt tokens:", reply.usage.prompt_tokens_details.cached_tokens)

for chunk in client.chat.completions.create(model="ninfer", messages=messages, max_tokens=64, stream=True):
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()

# structured outputs: the reply is JSON that follows the schema
schema = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
}
reply = client.chat.completions.create(
    model="ninfer",
    messages=messages,
    max_tokens=64,
    temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
)
print(reply.choices[0].message.content)

# the Responses API: a stored conversation continued by its id
ask = dict(model="ninfer", max_output_tokens=32, temperature=0)
first = client.responses.create(input="What is the capital of France?", **ask)
second = client.responses.create(input="And of Italy?", previous_response_id=first.id, **ask)
print(first.output_text, "/", second.output_text)

# Predicted Outputs: the reply expected (a file sent back with an edit) drafts where the reply follows it;
# with `ninfer serve --spec ngram` (or mtp / draft) it speeds the reply up, which stays what it would be
code = "def area(width, height):\n    return width * height\n"
edit = [{"role": "user", "content": f"Rename width to w in this code; reply with the code only:\n\n{code}"}]
reply = client.chat.completions.create(
    model="ninfer",
    messages=edit,
    max_tokens=64,
    temperature=0,
    prediction={"type": "content", "content": code.replace("width", "w")},
)
details = reply.usage.completion_tokens_details
print(
    "prediction tokens accepted / rejected:",
    details.accepted_prediction_tokens,
    details.rejected_prediction_tokens,
)
