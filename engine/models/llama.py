"""Llama, Qwen2 (Llama with biased q/k/v projections) and Qwen3 (Qwen3 = Llama + per-head q/k RMSNorm; Qwen3-MoE = Qwen3 whose sparse layers' MLP is a
mixture of experts, engine/layers/moe.py)."""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.layers.attention import Attention
from engine.layers.linear import Embedding, Linear, MergedLinear
from engine.layers.module import Module
from engine.layers.moe import make_mlp
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import CausalLM, DecoderModel


class LlamaAttention(Module):
    def __init__(self, config: ModelConfig, qk_norm: bool):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            {"q": q_size, "k": kv_size, "v": kv_size},
            bias=config.attention_bias or config.qkv_bias,
        )
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.rotary = RotaryEmbedding(config)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden).view(num_tokens, -1, self.head_dim)  # [T, Hq + 2 Hk, D]
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)  # [T, H*, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        o = self.attn(q, k, v)  # [T, Hq, D]
        return self.o_proj(o.reshape(num_tokens, -1))


class LlamaDecoderLayer(Module):
    def __init__(self, config: ModelConfig, qk_norm: bool, sparse: bool = False):
        """sparse: a mixture-of-experts MLP (Qwen3-MoE) instead of the dense one."""
        super().__init__()
        self.self_attn = LlamaAttention(config, qk_norm)
        self.mlp = make_mlp(config, sparse)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(DecoderModel):
    def __init__(self, config: ModelConfig, qk_norm: bool):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, qk_norm, config.is_sparse_layer(i))
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }
    qk_norm = False

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.model = LlamaModel(config, self.qk_norm)
        self.make_lm_head(self.model.embed_tokens)


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
