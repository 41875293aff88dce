"""Code completion against `ninfer serve CODER_MODEL` (a model trained for fill-in-the-middle, such as
Qwen2.5-Coder or Qwen3-Coder): llama.cpp's /infill, as editor plugins send it, and the OpenAI SDK's
`suffix`. The embedded default model has no FIM tokens: the server says so in one line."""

import json
import os
import urllib.error
import urllib.request

from openai import OpenAI

URL = os.environ.get("NINFER_URL", "http://127.0.0.1:8000")  # where `ninfer serve` listens
before = "def mean(values):\n    "
after = "\n    return total / len(values)\n"

# llama.cpp's /infill: other files as context, the middle held to the function's indentation
body = {
    "input_prefix": before,
    "input_suffix": after,
    "input_extra": [{"filename": "stats/__init__.py", "text": "from .mean import mean\n"}],
    "n_predict": 64,
    "n_indent": 4,
    "temperature": 0,
}
request = urllib.request.Request(
    f"{URL}/infill", json.dumps(body).encode(), {"Content-Type": "application/json"}
)
try:
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.load(response)
except urllib.error.HTTPError as e:
    raise SystemExit(json.load(e)["error"]["message"]) from None
print(before + reply["content"] + after)
print("stopped by:", reply["stop_type"], "| cached prompt tokens:", reply["tokens_cached"])

# the same gap through the OpenAI SDK's legacy completions
client = OpenAI(base_url=f"{URL}/v1", api_key="unused-unless---api-key")
completion = client.completions.create(
    model="ninfer", prompt=before, suffix=after, max_tokens=64, temperature=0
)
print(completion.choices[0].text)
