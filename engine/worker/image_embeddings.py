"""The vision tower's output for the images of the prompts being prefilled.

Each image is encoded once, by the first step whose prompt chunk reaches its tokens, and kept until the
step holding its last token has run (a long image may span chunks), or its request ends.
"""

from __future__ import annotations

import torch

from engine.scheduler.output import SchedulerOutput
from engine.transfer import to_device


class ImageEmbeddings:
    def __init__(self, tower, device: torch.device):
        self.tower, self.device = tower, device
        self._encoded: dict[tuple[str, int], torch.Tensor] = {}  # (request, image) -> [tokens, 1 + D, H]

    def forget(self, request_id: str) -> None:
        for key in [k for k in self._encoded if k[0] == request_id]:
            del self._encoded[key]

    def _embeddings(self, request_id: str, mm, image: int) -> torch.Tensor:
        key = (request_id, image)
        if key not in self._encoded:
            item = mm.images[image]
            pixels = item.pixel_values.to(self.device, non_blocking=True)
            self._encoded[key] = self.tower(pixels, item.grid_thw)  # [tokens, 1 + deepstack levels, H]
        return self._encoded[key]

    def step_embeddings(
        self, sched: SchedulerOutput, cu_seqlens: list[int]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(rows [M] int64, embeddings [M, 1 + D, H]) of the step's image tokens; (None, None) if none."""
        rows: list[int] = []
        parts: list[torch.Tensor] = []
        for i, r in enumerate(sched.scheduled):
            if r.mm is None:
                continue
            for image, lo, hi in r.mm.image_spans(r.start_pos, r.start_pos + r.num_known_tokens):
                offset = r.mm.offsets[image]
                parts.append(self._embeddings(r.request_id, r.mm, image)[lo - offset : hi - offset])
                first = cu_seqlens[i] + lo - r.start_pos
                rows.extend(range(first, first + hi - lo))
        if not rows:
            return None, None
        return to_device(rows, torch.int64, self.device), torch.cat(parts)

    def release_consumed(self, sched: SchedulerOutput) -> None:
        """Drop the images whose last token this step ran."""
        for r in sched.scheduled:
            if r.mm is None:
                continue
            for image, _, hi in r.mm.image_spans(r.start_pos, r.start_pos + r.num_known_tokens):
                if hi == r.mm.offsets[image] + r.mm.images[image].num_tokens:
                    self._encoded.pop((r.request_id, image), None)
