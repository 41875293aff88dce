"""Qwen3.5 hybrid text model: Gated DeltaNet layers + gated full attention (every `layer_types` says)."""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.layers.attention import Attention
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.layers.linear import Embedding, Linear, MergedLinear
from engine.layers.module import Module
from engine.layers.moe import make_mlp
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.base import CausalLM, DecoderModel
from engine.models.llama import LlamaForCausalLM


class Qwen3_5Attention(Module):
    """q_proj emits [q | gate] per head; output is o_proj(attn * sigmoid(gate)); q/k RMSNorm (1 + w);
    rotary on the first rotary_dim dims of each head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            config.hidden_size, {"q": 2 * q_size, "k": kv_size, "v": kv_size}, bias=config.attention_bias
        )
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centered=True)
        self.rotary = RotaryEmbedding(config)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_gate, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        q, gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(
            2, dim=-1
        )  # [T, Hq, D] each
        q = self.q_norm(q.contiguous())
        k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        o = self.attn(q, k, v) * torch.sigmoid(gate)  # [T, Hq, D]
        return self.o_proj(o.reshape(num_tokens, -1))


class Qwen3_5DecoderLayer(Module):
    def __init__(self, config: ModelConfig, layer_type: str, sparse: bool = False):
        """sparse: a mixture-of-experts MLP (Qwen3.5-MoE) instead of the dense one."""
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = Qwen3_5Attention(config)
        self.mlp = make_mlp(config, sparse)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=True)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=True)

    def forward(self, positions, hidden, residual):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        if self.layer_type == "linear_attention":
            hidden = self.linear_attn(hidden)
        else:
            hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3_5MTP(Module):
    """The multi-token-prediction head (`mtp.*`): from the final-normed hidden state at position p and the
    embedding of the token at p + 1, one full-attention decoder layer predicts the token at p + 2 (through
    the model's lm_head). Its own output hidden state stands in for the model's at the next position, so
    chaining it drafts several tokens. Its attention keeps KV at the same slots as the model's layers."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.fc = Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(h, eps, zero_centered=True)
        self.layers = nn.ModuleList(
            Qwen3_5DecoderLayer(config, "full_attention", config.num_experts > 0)
            for _ in range(config.mtp_num_hidden_layers)
        )
        self.norm = RMSNorm(h, eps, zero_centered=True)

    def forward(
        self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor, step: int = 0
    ) -> torch.Tensor:
        # positions [T]; embeds, hidden [T, H] -> [T, H] (final-normed, for lm_head and the next step)
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x, residual = self.layers[step % len(self.layers)](positions, self.fc(x), None)
        x, _ = self.norm(x, residual)
        return x


class Qwen3_5Model(DecoderModel):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Qwen3_5DecoderLayer(config, t, config.is_sparse_layer(i))
            for i, t in enumerate(config.layer_types)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=True)


class Qwen3_5ForCausalLM(CausalLM):
    packed_modules_mapping = {
        **LlamaForCausalLM.packed_modules_mapping,
        "in_proj_qkv": ("in_proj", "qkv"),
        "in_proj_z": ("in_proj", "z"),
        "in_proj_b": ("in_proj", "b"),
        "in_proj_a": ("in_proj", "a"),
    }
    renamed_params = {"conv1d.weight": "conv1d_weight"}

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.model = Qwen3_5Model(config)
        self.make_lm_head(self.model.embed_tokens)

    def build_mtp(self) -> None:
        if not self.config.mtp_num_hidden_layers:
            super().build_mtp()
        self.mtp = Qwen3_5MTP(self.config)
