"""Where `ninfer chat` sends the conversation: an engine in this process, or a server (`--url`).

The conversation's user messages carry their pictures as {"type": "image", "data": bytes} parts; each
backend turns them into what it takes (the chat template's image parts and preprocessed images, or OpenAI
`image_url` data URLs).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, TextIO

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


def data_url_part(data: bytes) -> dict[str, Any]:
    """A picture as an OpenAI `image_url` part holding a data URL."""
    url = f"data:{media_type(data)};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


@dataclass
class ReplyStats:
    """What `ninfer chat --verbose` prints after a reply. Token counts are the engine's (a server's usage;
    None where it sent none); times are measured here, from the request to the first and the last token."""

    start: float
    first: float | None = None
    last: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0  # streamed pieces with text (a server's token count when it sends no usage)

    def arrived(self) -> None:
        self.last = time.perf_counter()
        self.first = self.first or self.last
        self.chunks += 1

    def context_note(self, limit: int | None) -> str | None:
        """A line when the conversation (this prompt and reply) takes 3/4 of the context `limit` or more."""
        if limit is None or self.prompt_tokens is None:
            return None
        used = self.prompt_tokens + (self.completion_tokens or 0)
        if used * 4 < limit * 3:
            return None
        return (
            f"the conversation takes {used:,} of the {limit:,}-token context ({100 * used // limit}%); "
            "/compact has the model summarise it, /reset clears it"
        )

    def line(self) -> str:
        n = self.completion_tokens if self.completion_tokens is not None else self.chunks
        parts = []
        if self.prompt_tokens is not None:
            cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
            parts.append(f"prompt {self.prompt_tokens} tokens{cached}")
        if self.first is not None:
            parts.append(f"first token {1000 * (self.first - self.start):.0f} ms")
        rate = (n - 1) / (self.last - self.first) if n > 1 and self.last > self.first else None
        parts.append(f"{n} tokens" + (f" at {rate:.1f} tok/s" if rate else ""))
        return " · ".join(parts)


class PromptProgress:
    """A line on the terminal while a long prompt is read (it runs in --prefill-chunk pieces, and a long
    conversation can take a while): how much of it is in, the cached part counted; cleared as the reply
    begins. Nothing is written where the stream is not a terminal."""

    def __init__(self, stream: TextIO):
        self.stream, self.shown = stream, False
        self.on = stream.isatty()

    def show(self, total: int, processed: int) -> None:
        if self.on:
            self.stream.write(f"\r[reading the prompt: {100 * processed // total}% of {total:,} tokens]")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")  # back to the line's start, erased
            self.stream.flush()
            self.shown = False


class LocalChat:
    """The conversation on an engine (LLM) in this process."""

    def __init__(self, llm):
        self.llm = llm
        self.description = llm.description
        self.context_limit = llm.max_context  # (the REPL says when a conversation nears it)

    def attach(self, data: bytes) -> str:
        return f"attached ({self.llm.image(data).num_tokens} tokens)"

    def reply(
        self,
        messages: list[dict[str, Any]],
        params,
        stats: ReplyStats | None = None,
        progress: PromptProgress | None = None,
    ) -> Iterator[str]:
        images = [self.llm.image(data) for data in _images(messages)]
        local = _with_parts(messages, lambda _: {"type": "image"})
        if progress is not None:
            params = replace(params, return_progress=True)
        seen = 0
        for delta, out in self.llm.stream_chat(local, params, images):
            if out.prompt_progress is not None:
                total, _, processed = out.prompt_progress
                progress.show(total, processed)
                continue
            if progress is not None:
                progress.clear()
            if out.finish_reason == "error":  # the engine step failed; the engine goes on
                raise NinferError(out.error)
            if stats is not None:
                if len(out.token_ids) > seen:  # a token came (its text may be held back a while)
                    seen = len(out.token_ids)
                    stats.arrived()
                stats.prompt_tokens, stats.cached_tokens = len(out.prompt_token_ids), out.num_cached_tokens
                stats.completion_tokens = len(out.token_ids)
            if delta:
                yield delta


class RemoteChat:
    """The conversation on an OpenAI-compatible server (ninfer serve, vLLM, llama-server): streamed
    chat completions, pictures as data URLs. Sampling: the fields the flags gave (`sampling`); the rest
    are the server's defaults (ninfer serve's and vLLM's --generation-config, llama-server's --temp)."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        model: str | None,
        fields: dict | None = None,
        sampling: dict | None = None,
    ):
        from engine.bench.drivers import OverHttp

        self.server = OverHttp(url, api_key, model)
        self.fields = fields or {}  # more request fields (a response_format, ...)
        self.sampling = dict(sampling or {})  # the sampling flags given (and --override-generation-config)
        self.description = f"{url} (model {self.server.model})"
        self.context_limit = None  # (a server's usage is asked for with --verbose only)

    def attach(self, data: bytes) -> str:
        from engine.vision.image import decode_image

        decode_image(data)  # a file that is not an image is said here, not by the server
        return "attached"

    def reply(
        self,
        messages: list[dict[str, Any]],
        params,
        stats: ReplyStats | None = None,
        progress: PromptProgress | None = None,
    ) -> Iterator[str]:
        """(`progress`: shown where the server sends llama-server's prompt_progress: ninfer, llama-server)"""
        sampling: dict[str, Any] = {**self.fields, "max_tokens": params.max_tokens, **self.sampling}
        if params.seed is not None:
            sampling["seed"] = params.seed
        usage: dict[str, Any] | None = {} if stats is not None else None
        shown = progress.show if progress is not None else None
        for text in self.server.chat(_with_parts(messages, data_url_part), sampling, usage, shown):
            if progress is not None:
                progress.clear()
            if stats is not None:
                stats.arrived()
            yield text
        if usage:
            stats.prompt_tokens = usage.get("prompt_tokens")
            stats.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            stats.completion_tokens = usage.get("completion_tokens")


def check_source(model: str | None, url: str | None) -> None:
    if model is not None and url is not None:
        raise NinferError(f"give a MODEL or --url, not both (got {model} and --url {url})")
