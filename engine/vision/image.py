"""An image from a request, made into the tower's input: decoded, resized to whole merged patches, scaled,
normalized and cut into flattened patches in the order the tower merges them (Qwen2-VL's preprocessing)."""

from __future__ import annotations

import hashlib
import io
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.errors import NinferError
from engine.vision.config import VisionConfig

# a decoded image larger than this is refused before its pixels are decoded (a decompression bomb)
MAX_DECODED_PIXELS = 8192 * 8192
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class ImageInput:
    pixel_values: torch.Tensor  # [h * w, patch_dim] fp32: patches in merge-window order
    grid_thw: tuple[int, int, int]  # (1, h, w) patches
    digest: bytes  # of the preprocessed pixels: names the image in the prefix cache
    num_tokens: int  # merged patches: the <|image_pad|> tokens the image takes in the prompt


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size the image is resized to: sides multiples of `factor`, pixels within [min, max], the aspect
    ratio kept as closely as those allow."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise NinferError(
            f"the image is {width} x {height}: its sides differ by more than {MAX_ASPECT_RATIO}x; crop it"
        )
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def decode_image(data: bytes):
    """A PIL image in RGB; what is not an image gets one sentence."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > MAX_DECODED_PIXELS:
            raise NinferError(
                f"the image is {width} x {height} pixels; the limit is {MAX_DECODED_PIXELS} pixels, scale it down"
            )
        image.load()
    except UnidentifiedImageError as e:
        raise NinferError("the image data is not a PNG, JPEG, WebP, GIF or BMP image") from e
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise NinferError(f"the image could not be decoded ({e})") from e
    if image.mode != "RGB":
        # transparent pixels over white, as a viewer shows them
        if "A" in image.getbands() or image.mode == "P":
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba)
        image = image.convert("RGB")
    return image


class ImageCache:
    """Preprocessed images by their encoded bytes, least recently used first out past `max_bytes` of
    patches: an agent resends its conversation's screenshots every turn, and decoding and resizing each
    again would add to every turn's time to first token. Safe to call from several threads."""

    def __init__(self, config: VisionConfig, max_bytes: int = 1 << 30):
        self.config, self.max_bytes = config, max_bytes
        self._items: OrderedDict[tuple[bytes, int | None], ImageInput] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, data: bytes, max_pixels: int | None = None) -> ImageInput:
        key = (hashlib.blake2b(data, digest_size=16).digest(), max_pixels)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        image = preprocess(data, self.config, max_pixels)
        size = image.pixel_values.numel() * image.pixel_values.element_size()
        with self._lock:
            if key not in self._items:
                self._items[key] = image
                self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.pixel_values.numel() * old.pixel_values.element_size()
        return image


def preprocess(data: bytes, config: VisionConfig, max_pixels: int | None = None) -> ImageInput:
    """Encoded image bytes -> the tower's input; `max_pixels` lowers the preprocessor's limit (OpenAI's
    detail "low")."""
    from PIL import Image

    image = decode_image(data)
    limit = min(config.max_pixels, max_pixels or config.max_pixels)
    h, w = smart_resize(image.height, image.width, config.factor, min(config.min_pixels, limit), limit)
    if (image.height, image.width) != (h, w):
        image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
    raw = image.tobytes()
    # the resized pixels name the image (what the tower sees, at a tenth of the patches' bytes)
    digest = hashlib.blake2b(raw, digest_size=16, person=b"ninfer-image")
    digest.update(f"{h}x{w}".encode())
    pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(h, w, 3)
    x = pixels.permute(2, 0, 1).float() / 255.0  # [C, H, W]
    mean = torch.tensor(config.image_mean).view(-1, 1, 1)
    std = torch.tensor(config.image_std).view(-1, 1, 1)
    return patchify((x - mean) / std, config, digest.digest())


def patchify(x: torch.Tensor, config: VisionConfig, digest: bytes) -> ImageInput:
    """x [C, H, W] normalized -> patches [gh * gw, C * T * P * P], each merge window's patches together
    (block row, block column, row in block, column in block), the still image repeated T times."""
    c, height, width = x.shape
    p, m, t = config.patch_size, config.spatial_merge_size, config.temporal_patch_size
    gh, gw = height // p, width // p
    x = x.reshape(c, gh // m, m, p, gw // m, m, p)
    x = x.permute(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
    x = x.unsqueeze(5).expand(*x.shape[:5], t, p, p)  # [.., C, T, P, P]
    patches = x.reshape(gh * gw, c * t * p * p).contiguous()
    return ImageInput(patches, (1, gh, gw), digest, gh * gw // (m * m))
