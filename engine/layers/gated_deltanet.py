"""Gated DeltaNet linear attention (the Qwen3.5 hybrid's recurrent layers)."""

from __future__ import annotations

import torch
from torch import nn

import ninfer_kernels as kernels
from engine.config import ModelConfig
from engine.layers.linear import Linear, MergedLinear, make_param
from engine.layers.module import Module
from engine.layers.norm import GatedRMSNorm
from engine.worker.forward_context import get_forward_context


class GatedDeltaNet(Module):
    """in_proj (qkv | z | b | a, fused) -> causal conv1d + SiLU on qkv -> gated delta rule -> gated norm -> out_proj.

    Per-sequence state lives in the state pool: conv_state [slots, conv_dim, K - 1] and
    ssm_state [slots, Hv, Dk, Dv] fp32, bound by the model runner.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        key_dim = self.num_k_heads * self.head_k_dim
        value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * key_dim + value_dim
        self.key_dim, self.value_dim = key_dim, value_dim
        self.in_proj = MergedLinear(
            config.hidden_size,
            {"qkv": self.conv_dim, "z": value_dim, "b": self.num_v_heads, "a": self.num_v_heads},
        )
        self.conv1d_weight = make_param(
            self.conv_dim, config.linear_conv_kernel_dim, loader=_load_conv_weight
        )
        self.dt_bias = make_param(self.num_v_heads)
        self.A_log = make_param(self.num_v_heads)
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = Linear(value_dim, config.hidden_size)
        self.conv_state: torch.Tensor | None = None
        self.ssm_state: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [T, hidden]
        ctx = get_forward_context()
        num_tokens = hidden.shape[0]
        mixed_qkv, z, b, a = self.in_proj.split(self.in_proj(hidden))
        mixed_qkv = kernels.causal_conv1d(
            mixed_qkv, self.conv1d_weight, self.conv_state, ctx.cu_seqlens_q, ctx.state_indices
        )
        q, k, v = mixed_qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.view(num_tokens, self.num_k_heads, self.head_k_dim)
        k = k.view(num_tokens, self.num_k_heads, self.head_k_dim)
        v = v.view(num_tokens, self.num_v_heads, self.head_v_dim)
        beta = b.sigmoid()  # [T, Hv]
        g = -self.A_log.float().exp() * nn.functional.softplus(a.float() + self.dt_bias.float())  # [T, Hv]
        o = kernels.gated_delta_rule(
            q, k, v, g, beta, self.ssm_state, ctx.cu_seqlens_q, ctx.state_indices, use_qk_l2norm=True
        )
        o = self.norm(o, z.view(num_tokens, self.num_v_heads, self.head_v_dim))
        return self.out_proj(o.reshape(num_tokens, self.value_dim))


def _load_conv_weight(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
    # checkpoints store nn.Conv1d's [C, 1, K]
    param.data.copy_(loaded.reshape(param.shape))
