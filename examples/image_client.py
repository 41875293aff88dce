"""Send an image to `ninfer serve MODEL --vision` (a Qwen3.5 or Qwen3-VL checkpoint), over both
protocols: `python examples/image_client.py screenshot.png`."""

import base64
import os
import sys
from pathlib import Path

from anthropic import Anthropic
from openai import OpenAI

if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
    sys.exit("usage: python examples/image_client.py IMAGE_FILE (with ninfer serve MODEL --vision running)")
path = Path(sys.argv[1])
URL = os.environ.get("NINFER_URL", "http://127.0.0.1:8000")  # where `ninfer serve` listens
media_type = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}.get(
    path.suffix.lower(), "image/png"
)
data = base64.b64encode(path.read_bytes()).decode()
question = "Describe this image in one sentence."

openai = OpenAI(base_url=f"{URL}/v1", api_key="unused-unless---api-key")
reply = openai.chat.completions.create(
    model="ninfer",
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}},
            ],
        }
    ],
    max_tokens=128,
)
print("OpenAI:", reply.choices[0].message.content, f"({reply.usage.prompt_tokens} prompt tokens)")

anthropic = Anthropic(base_url=URL, api_key="unused-unless---api-key")
message = anthropic.messages.create(
    model="ninfer",
    max_tokens=128,
    messages=[
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}},
                {"type": "text", "text": question},
            ],
        }
    ],
)
print("Anthropic:", message.content[0].text)
