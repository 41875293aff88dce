"""Images in request messages: OpenAI `image_url` parts and Anthropic `image` blocks, sent inline (base64),
made into the template's image parts and the engine's preprocessed inputs."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from typing import Any

from engine.api.errors import ApiError
from engine.errors import NinferError
from engine.vision.image import ImageInput

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp")
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*),(?P<data>.*)", re.DOTALL)
_NOT_FETCHED = (
    "image URLs are not fetched (the server reaches no network on the client's behalf); send the image inline"
)


# OpenAI's image detail "low": a 512 x 512 image's worth of pixels (256 tokens at Qwen's 32-pixel tiles)
LOW_DETAIL_PIXELS = 512 * 512


class MessageImages:
    """The images of one request's messages in prompt order, each with where it was in the body and the
    most pixels it may keep (None: the checkpoint's limit). `read_scans`: the server takes images, so a PDF
    page without text goes to the model as its scanned images (engine/api/documents.py)."""

    def __init__(self, read_scans: bool = False) -> None:
        self.items: list[tuple[str, bytes, int | None]] = []
        self.read_scans = read_scans

    def add(self, data: bytes, where: str, max_pixels: int | None = None) -> dict[str, str]:
        """Keep an image; returns the chat template's part for it (the template writes its placeholder)."""
        self.items.append((where, data, max_pixels))
        return {"type": "image"}


def template_content(parts: list[str | dict[str, str]]) -> str | list[dict[str, str]]:
    """A message's content for the chat template: its text, or, when it holds images, its parts in order
    (text parts and {"type": "image"}), as transformers' processors pass them."""
    if all(isinstance(p, str) for p in parts):
        return "".join(parts)
    out: list[dict[str, str]] = []
    for p in parts:
        if isinstance(p, str):
            if out and out[-1]["type"] == "text":
                out[-1] = {"type": "text", "text": out[-1]["text"] + p}
            elif p:
                out.append({"type": "text", "text": p})
        else:
            out.append(p)
    return out


def _base64(data: Any, where: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise ApiError(400, f"{where} must hold the image as a base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, f"{where} is not valid base64 ({e})") from e


def openai_image(part: dict[str, Any], where: str) -> tuple[bytes, int | None]:
    """The bytes of an OpenAI `image_url` part, {"image_url": {"url": "data:image/png;base64,...",
    "detail": "auto"}}, and its pixel limit (detail "low": LOW_DETAIL_PIXELS; "high", "auto": none)."""
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    detail = image_url.get("detail", "auto") if isinstance(image_url, dict) else "auto"
    if detail not in ("low", "high", "auto", None):
        raise ApiError(400, f"{where}.image_url.detail is {detail!r}; use low, high or auto")
    if not isinstance(url, str):
        raise ApiError(400, f"{where}.image_url.url must be a string (a data: URL)")
    if url.startswith(("http://", "https://")):
        raise ApiError(400, f"{where}: {_NOT_FETCHED} as a data URL (data:image/png;base64,...)")
    match = _DATA_URL.fullmatch(url)
    if match is None or ";base64" not in (match["params"] or ""):
        raise ApiError(400, f"{where}.image_url.url must be a base64 data URL (data:image/png;base64,...)")
    if match["media"] and match["media"] not in MEDIA_TYPES:
        raise ApiError(400, f"{where} is {match['media']}; send one of {', '.join(MEDIA_TYPES)}")
    return _base64(match["data"], f"{where}.image_url.url"), LOW_DETAIL_PIXELS if detail == "low" else None


def anthropic_image(block: dict[str, Any], where: str) -> bytes:
    """The bytes of an Anthropic `image` block: {"source": {"type": "base64", "media_type", "data"}}."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise ApiError(400, f"{where}.source must be an object")
    if source.get("type") == "url":
        raise ApiError(400, f"{where}: {_NOT_FETCHED} (source type base64)")
    if source.get("type") != "base64":
        raise ApiError(400, f"{where}.source.type is {source.get('type')!r}; send base64")
    if source.get("media_type") not in MEDIA_TYPES:
        raise ApiError(
            400,
            f"{where}.source.media_type is {source.get('media_type')!r}; use one of {', '.join(MEDIA_TYPES)}",
        )
    return _base64(source.get("data"), f"{where}.source.data")


async def preprocess_images(state, images: MessageImages) -> list[ImageInput]:
    """Decode and preprocess each image off the event loop; a bad one is named by where it was."""
    out = []
    for where, data, max_pixels in images.items:
        try:
            out.append(await asyncio.to_thread(state.engine.llm.image, data, max_pixels))
        except NinferError as e:
            raise ApiError(400, f"{where}: {e}") from e
    return out
