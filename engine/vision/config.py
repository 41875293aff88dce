"""The vision tower's shapes, its image preprocessing and the placeholder token ids, from a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import NinferError

# the memory ledger reserves the tower's activations for this many patches (a 2048 x 2048 image at patch
# 16, docs/memory.md); larger images are scaled down to it, as the preprocessor's own pixel limit does
MAX_IMAGE_PATCHES = 16384


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int  # the text model's hidden size: one merged patch is one token embedding
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2  # a still image is repeated this many times along time
    spatial_merge_size: int = 2  # merge x merge neighbouring patches make one token
    num_position_embeddings: int = 2304  # the learned position grid (48 x 48), resampled to each image
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    layer_norm_eps: float = 1e-6
    # Qwen3-VL's deepstack: the outputs of these blocks, merged apart, are added to the first text layers'
    # outputs at the image tokens (one level a layer); Qwen3.5 has none
    deepstack_visual_indexes: tuple[int, ...] = ()
    image_token_id: int = 248056  # <|image_pad|>: one per merged patch in the prompt
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054
    # preprocessing (the checkpoint's preprocessor_config.json)
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    min_pixels: int = 65536
    max_pixels: int = 16384 * 256

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: channels x time x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def factor(self) -> int:
        """Image sides are resized to multiples of this (one merged token's side in pixels)."""
        return self.patch_size * self.spatial_merge_size

    @staticmethod
    def from_dict(vision: dict[str, Any]) -> VisionConfig:
        """From ModelConfig.vision_config: transformers' vision_config, with the token ids and the
        preprocessor's settings the loader adds (engine/formats/hf_dir.py)."""
        try:
            depth, hidden = int(vision["depth"]), int(vision["hidden_size"])
            inter, heads = int(vision["intermediate_size"]), int(vision["num_heads"])
            out_hidden = int(vision["out_hidden_size"])
        except KeyError as e:
            raise NinferError(
                f"the checkpoint's vision_config lacks {e.args[0]}; it is not a Qwen3.5 / Qwen3-VL vision tower"
            ) from e
        deepstack = tuple(int(i) for i in vision.get("deepstack_visual_indexes") or ())
        if any(not 0 <= i < depth for i in deepstack):
            raise NinferError(
                f"the vision_config's deepstack_visual_indexes {list(deepstack)} name blocks past its depth "
                f"{depth}; the checkpoint's config is inconsistent"
            )
        pre = vision.get("preprocessor") or {}
        size = pre.get("size") or {}
        patch = int(_scalar(vision.get("patch_size", 16)))
        budget = MAX_IMAGE_PATCHES * patch * patch
        rope = vision.get("rope_parameters") or {}
        ids = {
            k: int(vision[k])
            for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id")
            if k in vision
        }
        return VisionConfig(
            depth=depth,
            hidden_size=hidden,
            intermediate_size=inter,
            num_heads=heads,
            out_hidden_size=out_hidden,
            in_channels=int(vision.get("in_channels", 3)),
            patch_size=patch,
            temporal_patch_size=int(_scalar(vision.get("temporal_patch_size", 2))),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            num_position_embeddings=int(vision.get("num_position_embeddings", 2304)),
            hidden_act=str(vision.get("hidden_act", "gelu_pytorch_tanh")),
            rope_theta=float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))),
            image_mean=tuple(float(x) for x in pre.get("image_mean", (0.5, 0.5, 0.5))),
            image_std=tuple(float(x) for x in pre.get("image_std", (0.5, 0.5, 0.5))),
            min_pixels=int(size.get("shortest_edge", pre.get("min_pixels", 65536))),
            max_pixels=min(int(size.get("longest_edge", pre.get("max_pixels", budget))), budget),
            deepstack_visual_indexes=deepstack,
            **ids,
        )


def _scalar(x: Any) -> Any:
    """patch_size may be stored as [p, p]."""
    return x[0] if isinstance(x, list | tuple) else x
