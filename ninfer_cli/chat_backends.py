"""Where `ninfer chat` sends the conversation: an engine in this process, or a server (`--url`).

The conversation's user messages carry their pictures as {"type": "image", "data": bytes} parts; each
backend turns them into what it takes (the chat template's image parts and preprocessed images, or OpenAI
`image_url` data URLs).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from engine.errors import NinferError

_SIGNATURES = {
    b"\x89PNG": "image/png",
    b"\xff\xd8": "image/jpeg",
    b"GIF8": "image/gif",
    b"BM": "image/bmp",
}


def _images(messages: list[dict[str, Any]]) -> list[bytes]:
    return [
        part["data"]
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image"
    ]


def _with_parts(messages: list[dict[str, Any]], image_part) -> list[dict[str, Any]]:
    """The messages with each picture part replaced by image_part(bytes)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [image_part(p["data"]) if p["type"] == "image" else p for p in content]
        out.append({**m, "content": content})
    return out


def media_type(data: bytes) -> str:
    """The MIME type of encoded image bytes, by their signature (image/png when unknown)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((t for sig, t in _SIGNATURES.items() if data.startswith(sig)), "image/png")


class LocalChat:
    """The conversation on an engine (LLM) in this process."""

    def __init__(self, llm):
        self.llm = llm
        self.description = llm.description

    def attach(self, data: bytes) -> str:
        return f"attached ({self.llm.image(data).num_tokens} tokens)"

    def reply(self, messages: list[dict[str, Any]], params) -> Iterator[str]:
        images = [self.llm.image(data) for data in _images(messages)]
        local = _with_parts(messages, lambda _: {"type": "image"})
        for delta, _ in self.llm.stream_chat(local, params, images):
            if delta:
                yield delta


class RemoteChat:
    """The conversation on an OpenAI-compatible server (ninfer serve, vLLM, llama-server): streamed
    chat completions, pictures as data URLs."""

    def __init__(self, url: str, api_key: str | None, model: str | None, fields: dict | None = None):
        from engine.bench.drivers import OverHttp

        self.server = OverHttp(url, api_key, model)
        self.fields = fields or {}  # more request fields (a response_format, ...)
        self.description = f"{url} (model {self.server.model})"

    def attach(self, data: bytes) -> str:
        from engine.vision.image import decode_image

        decode_image(data)  # a file that is not an image is said here, not by the server
        return "attached"

    def reply(self, messages: list[dict[str, Any]], params) -> Iterator[str]:
        def data_url(data: bytes) -> dict[str, Any]:
            url = f"data:{media_type(data)};base64,{base64.b64encode(data).decode()}"
            return {"type": "image_url", "image_url": {"url": url}}

        sampling: dict[str, Any] = {
            **self.fields,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.top_k:
            sampling["top_k"] = params.top_k
        if params.seed is not None:
            sampling["seed"] = params.seed
        yield from self.server.chat(_with_parts(messages, data_url), sampling)


def check_source(model: str | None, url: str | None) -> None:
    if model is not None and url is not None:
        raise NinferError(f"give a MODEL or --url, not both (got {model} and --url {url})")
