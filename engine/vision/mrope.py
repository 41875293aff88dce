"""Where a request's images sit in its prompt, and the 3D rotary positions (M-RoPE) they give every token.

A text token at prompt index i has position (p, p, p); an image's merged patch at row r, column c of its
h x w token grid has (s, s + r, s + c), s being the position after the text before it; the text after the
image continues from s + max(h, w). So from the first image on, a token's position trails its index: by
`rope_delta` after the last one. Generated tokens are text at index + rope_delta.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import NinferError
from engine.vision.config import VisionConfig
from engine.vision.image import ImageInput


@dataclass(frozen=True)
class MultiModalInputs:
    images: tuple[ImageInput, ...]
    offsets: tuple[int, ...]  # prompt index of each image's first <|image_pad|>
    positions: torch.Tensor  # [3, prompt tokens] int64: (time, row, column) position of each prompt token
    rope_delta: int  # position - index of every token after the last image (generated ones too)

    def image_spans(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(image, first, last + 1) prompt indices of each image's tokens within [start, end)."""
        out = []
        for i, (image, offset) in enumerate(zip(self.images, self.offsets)):
            lo, hi = max(start, offset), min(end, offset + image.num_tokens)
            if lo < hi:
                out.append((i, lo, hi))
        return out

    def widened(self, positions: tuple[int, ...]) -> tuple[int, ...]:
        """Prompt positions before the placeholders were widened, as positions after: each image whose
        placeholder came before a position adds its tokens but one."""
        out = []
        for p in positions:
            extra = 0
            for image, offset in zip(self.images, self.offsets):
                if offset - extra >= p:  # (offset - extra: the placeholder's index before widening)
                    break
                extra += image.num_tokens - 1
            out.append(p + extra)
        return tuple(out)

    def block_salts(self, first_block: int, num_blocks: int, block_size: int) -> list[bytes]:
        """Per page, the digests of the images whose tokens it holds: two prompts whose placeholders
        match but whose pictures differ must not share cached pages."""
        salts = []
        for b in range(first_block, first_block + num_blocks):
            spans = self.image_spans(b * block_size, (b + 1) * block_size)
            salts.append(b"".join(self.images[i].digest for i, _, _ in spans))
        return salts


def place_images(
    prompt_ids: list[int], images: list[ImageInput], config: VisionConfig
) -> tuple[list[int], MultiModalInputs]:
    """The prompt with each image's one <|image_pad|> (as the chat template renders it) widened to the
    image's token count, and where the images are. Refused when the placeholders and images disagree."""
    ids, offsets = widen_placeholders(prompt_ids, images, config.image_token_id)
    positions, delta = mrope_positions(len(ids), images, offsets, config.spatial_merge_size)
    return ids, MultiModalInputs(tuple(images), tuple(offsets), positions, delta)


def widen_placeholders(
    prompt_ids: list[int], images: list[ImageInput], pad: int
) -> tuple[list[int], list[int]]:
    """(the prompt with each image's one `pad` token repeated num_tokens times, each image's first index)."""
    found = [i for i, t in enumerate(prompt_ids) if t == pad]
    if len(found) != len(images):
        raise NinferError(
            f"the prompt holds {len(found)} image placeholder(s) (<|image_pad|>) for {len(images)} image(s); "
            "each image needs exactly one, where the chat template puts it"
        )
    ids: list[int] = []
    offsets: list[int] = []
    last = 0
    for index, image in zip(found, images):
        ids.extend(prompt_ids[last:index])
        offsets.append(len(ids))
        ids.extend([pad] * image.num_tokens)
        last = index + 1
    ids.extend(prompt_ids[last:])
    return ids, offsets


def mrope_positions(
    num_tokens: int, images: list[ImageInput], offsets: list[int], merge: int
) -> tuple[torch.Tensor, int]:
    """[3, num_tokens] int64 positions, and rope_delta (see the module docstring)."""
    out = torch.empty(3, num_tokens, dtype=torch.int64)
    index, pos = 0, 0
    for image, offset in zip(images, offsets):
        text = offset - index
        out[:, index:offset] = torch.arange(pos, pos + text)
        pos += text
        _, gh, gw = image.grid_thw
        h, w = gh // merge, gw // merge
        # tokens in row-major order of the merged grid (the merger's order)
        rows = torch.arange(h).repeat_interleave(w)
        cols = torch.arange(w).repeat(h)
        span = slice(offset, offset + h * w)
        out[0, span], out[1, span], out[2, span] = pos, pos + rows, pos + cols
        pos += max(h, w)
        index = offset + h * w
    out[:, index:] = torch.arange(pos, pos + num_tokens - index)
    return out, pos - index


def frequency_axes(mrope_section: tuple[int, ...], interleaved: bool, num_freqs: int) -> torch.Tensor:
    """[num_freqs] int64: the axis (0 time, 1 row, 2 column) whose position turns each rotary frequency.
    Interleaved (Qwen3.5): t, h, w, t, h, w, ... while each axis has sections left, then time; otherwise
    contiguous sections t..., h..., w...."""
    if sum(mrope_section) != num_freqs:
        raise NinferError(
            f"mrope_section {list(mrope_section)} covers {sum(mrope_section)} rotary frequencies; the model "
            f"rotates {num_freqs}: the checkpoint's config is inconsistent"
        )
    if not interleaved:
        return torch.tensor([a for a, n in enumerate(mrope_section) for _ in range(n)], dtype=torch.int64)
    axes = torch.zeros(num_freqs, dtype=torch.int64)
    for axis in (1, 2):
        axes[axis : 3 * mrope_section[axis] : 3] = axis
    return axes
