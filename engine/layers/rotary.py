"""Rotary embedding frequencies (default, linear, llama3, YaRN scaling, GGUF frequency factors) and the rope
op."""

from __future__ import annotations

import math

import torch

import ninfer_kernels as kernels
from engine.config import ModelConfig
from engine.errors import NinferError
from engine.layers.module import Module
from engine.rope_scaling import attention_factor, yarn_inv_freq
from engine.vision.mrope import frequency_axes
from ninfer_kernels.step_memo import StepMemo


def inv_freq_for(config: ModelConfig) -> torch.Tensor:
    """[rotary_dim / 2] fp32 inverse frequencies, scaled as the config's rope_scaling says."""
    dim = config.rotary_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        pass
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind == "yarn":
        inv_freq = yarn_inv_freq(scaling, config.rope_theta, dim)
    elif kind == "freq_factors":  # a GGUF's rope_freqs: each frequency divided by its factor (as llama.cpp)
        factors = torch.tensor(scaling["factors"], dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise NinferError(
                f"the GGUF's rope_freqs has {factors.numel()} factors; this model rotates {inv_freq.numel()} "
                "frequency pairs: the file is inconsistent, convert it again"
            )
        inv_freq = inv_freq / factors
    else:
        raise NinferError(
            f"rope scaling '{kind}' is not supported yet; supported: default, linear, llama3, yarn, GGUF "
            "rope_freqs"
        )
    return inv_freq.float()


def cos_sin_cache_for(config: ModelConfig, device: torch.device) -> torch.Tensor:
    """[position_limit, rotary_dim] fp32: cos | sin per position (times YaRN's attention factor), shared by
    every layer."""
    key = (
        config.rotary_dim,
        config.rope_theta,
        repr(config.rope_scaling),
        config.position_limit,
        str(device),
    )
    cache = _COS_SIN_CACHES.get(key)
    if cache is None:
        inv_freq = inv_freq_for(config)
        positions = torch.arange(config.position_limit, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [P, R/2]
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1) * attention_factor(config.rope_scaling)
        cache = cache.to(device)
        _COS_SIN_CACHES[key] = cache
    return cache


_COS_SIN_CACHES: dict[tuple, torch.Tensor] = {}


def shared_tables() -> list[torch.Tensor]:
    """The cos/sin tables every model of the process shares (a model that sleeps must leave them be)."""
    return list(_COS_SIN_CACHES.values())


# every attention layer of a step turns its 3D positions into the same per-token cos/sin table
_MROPE_TABLES = StepMemo()


class RotaryEmbedding(Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        # NOTE: a plain attribute, not a buffer: models are built on uninitialised storage and loaded
        # from checkpoints, which never hold this tensor
        self.cos_sin_cache = cos_sin_cache_for(config, torch.get_default_device())
        self.axes = None  # M-RoPE: [R] the position axis of each cos | sin column
        if config.mrope_section:
            half = config.rotary_dim // 2
            axes = frequency_axes(config.mrope_section, config.mrope_interleaved, half)
            self.axes = torch.cat([axes, axes]).to(self.cos_sin_cache.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # positions: [T], or [3, T] (time, row, column: a step with image tokens, engine/vision/mrope.py)
        if positions.dim() == 1:
            return kernels.rope(q, k, positions, self.cos_sin_cache)
        if self.axes is None:
            raise NinferError("this model has no M-RoPE sections (mrope_section), so it takes 1D positions")
        # each token's own cos | sin row, every column read at its axis' position; then token t is "position" t
        table = _MROPE_TABLES.get(
            (positions,), (self.cos_sin_cache, self.axes), lambda: self._table(positions)
        )
        return kernels.rope(q, k, torch.arange(positions.shape[1], device=positions.device), table)

    def _table(self, positions: torch.Tensor) -> torch.Tensor:
        by_axis = self.cos_sin_cache[positions]  # [3, T, R]
        index = self.axes.view(1, 1, -1).expand(1, *by_axis.shape[1:])
        return by_axis.gather(0, index)[0].contiguous()  # [T, R]
