"""Rotary frequencies against transformers (llama3 scaling) and llama.cpp's GGUF frequency factors
(rope_freqs.weight, which its converter writes for Llama 3.1+ instead of the llama3 scaling keys)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import rope_model_config, write_config_gguf

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.gguf import _config
from engine.layers.rotary import inv_freq_for

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _config_with(scaling) -> ModelConfig:
    return rope_model_config(rope_scaling=scaling)


def _converter_factors() -> list[float]:
    """What llama.cpp's HF -> GGUF converter writes to rope_freqs for a llama3-scaled model: 1 for the
    high frequencies, `factor` for the low ones, the inverse of the llama3 blend between."""
    s = LLAMA3
    base = 1.0 / (500000.0 ** (np.arange(0, 128, 2) / 128))
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for freq in base:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"]
            )
            out.append(1.0 / ((1 - smooth) / s["factor"] + smooth))
    return out


def test_llama3_scaling_matches_transformers():
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = tf.LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        head_dim=128,
        max_position_embeddings=131072,
        rope_parameters={**LLAMA3, "rope_theta": 500000.0},
    )
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    assert torch.allclose(inv_freq_for(_config_with(LLAMA3)), want.float(), rtol=1e-6, atol=0)


def test_gguf_frequency_factors_give_the_llama3_frequencies():
    scaling = {"rope_type": "freq_factors", "factors": _converter_factors()}
    got = inv_freq_for(_config_with(scaling))
    assert torch.allclose(got, inv_freq_for(_config_with(LLAMA3)), rtol=1e-5, atol=0)
    with pytest.raises(NinferError, match="rope_freqs has 3 factors; this model rotates 64"):
        inv_freq_for(_config_with({"rope_type": "freq_factors", "factors": [1.0, 2.0, 3.0]}))


def test_gguf_rope_freqs_tensor_is_read_into_the_config(tmp_path):
    path = tmp_path / "tiny.gguf"
    factors = np.array(_converter_factors(), dtype=np.float32)
    reader = write_config_gguf(path, "llama", 131072, 500000.0, tensors={"rope_freqs.weight": factors})
    config = _config(reader, path)
    assert config.rope_scaling["rope_type"] == "freq_factors"
    assert np.allclose(config.rope_scaling["factors"], factors)
    assert torch.allclose(inv_freq_for(config), inv_freq_for(_config_with(LLAMA3)), rtol=1e-5, atol=0)
