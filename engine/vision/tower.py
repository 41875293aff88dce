"""The vision tower (Qwen3.5): patch embedding, a learned position grid resampled to the image, ViT blocks
with 2D rotary attention over each image's patches, and the merger that turns every merge x merge patches
into one token embedding of the text model. Dense torch ops in the model dtype (its few hundred million
weights run once per image, at prefill)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import Embedding, Linear, make_param
from engine.layers.module import Module
from engine.vision.config import VisionConfig


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.bias, self.eps = make_param(dim), make_param(dim), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def _load_patch_kernel(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
    """The checkpoint's Conv3d kernel [hidden, C, T, P, P], whose stride is its size: a linear map of each
    flattened patch."""
    flat = loaded.reshape(loaded.shape[0], -1)
    if flat.shape != param.shape:
        raise ValueError(
            f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}"
        )
    param.data.copy_(flat)


class PatchEmbed(Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.proj = Linear(config.patch_dim, config.hidden_size, bias=True)
        self.proj.weight.weight_loader = _load_patch_kernel


class VisionMLP(Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.linear_fc1 = Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.approximate = "tanh" if "tanh" in config.hidden_act else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [N, heads, D]; cos, sin [N, 1, D] fp32: rotate-half over the whole head
    half = x.shape[-1] // 2
    xf = x.float()
    swapped = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + swapped * sin).to(x.dtype)


class VisionAttention(Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = Linear(config.hidden_size, config.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [N, hidden]: one image's patches, every patch attending to every other
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)  # [N, heads, D] each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        # [1, heads, N, D]: four dimensions take the flash / memory-efficient kernels (a 3D call falls
        # back to materialising the N x N scores: 17 GB for a 2048 x 2048 image's 16 heads)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v)[0]  # [heads, N, D]
        return self.proj(o.transpose(0, 1).reshape(n, -1))


class VisionBlock(Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.norm1 = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.norm2 = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.attn = VisionAttention(config)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(Module):
    """LayerNorm each patch, then merge x merge neighbours (consecutive rows) -> MLP -> a text embedding.
    A deepstack merger (postshuffle) normalizes the merged rows instead."""

    def __init__(self, config: VisionConfig, postshuffle: bool = False):
        super().__init__()
        merged = config.hidden_size * config.spatial_merge_size**2
        self.norm = LayerNorm(merged if postshuffle else config.hidden_size, config.layer_norm_eps)
        self.linear_fc1 = Linear(merged, merged, bias=True)
        self.linear_fc2 = Linear(merged, config.out_hidden_size, bias=True)
        self.merged, self.postshuffle = merged, postshuffle

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.view(-1, self.merged)) if self.postshuffle else self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(Module):
    def __init__(self, config: VisionConfig):
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = Embedding(config.num_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(config, postshuffle=True) for _ in config.deepstack_visual_indexes
        )

    def _merge_order(self, grid: torch.Tensor) -> torch.Tensor:
        # grid [..., h, w] -> [..., h * w] with each merge window's patches together
        m = self.config.spatial_merge_size
        *lead, h, w = grid.shape
        grid = grid.reshape(*lead, h // m, m, w // m, m).transpose(-3, -2)
        return grid.reshape(*lead, h * w)

    def _position_embeddings(self, h: int, w: int) -> torch.Tensor:
        """[h * w, hidden]: the learned square grid resampled bilinearly (corners aligned) to h x w."""
        side = int(self.config.num_position_embeddings**0.5)
        table = self.pos_embed.weight.view(side, side, -1).permute(2, 0, 1).float()  # [hidden, side, side]
        grid = F.interpolate(table[None], size=(h, w), mode="bilinear", align_corners=True)[0]
        return self._merge_order(grid).t()

    def _rotary(self, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [h * w, 1, head_dim] fp32: the first half of the frequencies turn with the patch's row,
        the second with its column."""
        dim = self.config.head_dim // 2
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
        rows = torch.arange(h, device=device)[:, None].expand(h, w)
        cols = torch.arange(w, device=device)[None, :].expand(h, w)
        pos = self._merge_order(torch.stack([rows, cols]))  # [2, h * w]
        freqs = (pos[..., None].float() * inv_freq).permute(1, 0, 2).reshape(h * w, dim)  # [N, dim]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()

    def forward(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> torch.Tensor:
        # pixel_values [h * w, patch_dim] (one still image) -> [h * w / merge^2, 1 + deepstack levels,
        # out_hidden]: each token's embedding, then what each deepstack level adds after a text layer
        t, h, w = grid_thw
        assert t == 1, "a still image is one frame"
        dtype = self.pos_embed.weight.dtype
        x = self.patch_embed.proj(pixel_values.to(dtype))
        x = x + self._position_embeddings(h, w).to(dtype)
        cos, sin = self._rotary(h, w, x.device)
        levels = []
        deepstack = self.config.deepstack_visual_indexes
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin)
            if i in deepstack:
                levels.append(self.deepstack_merger_list[deepstack.index(i)](x))
        return torch.stack([self.merger(x), *levels], dim=1)
