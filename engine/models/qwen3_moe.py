"""Qwen3-MoE: Qwen3 (Llama + q/k norm) whose sparse layers' MLP is a mixture of experts (engine/layers/moe.py)."""

from __future__ import annotations

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.layers.moe import make_mlp
from engine.models.base import CausalLM
from engine.models.llama import LlamaForCausalLM, LlamaModel


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    qk_norm = True

    def __init__(self, config: ModelConfig):
        missing = [
            name
            for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
            if getattr(config, name) <= 0
        ]
        if missing:
            raise NinferError(f"this {config.architecture} config.json lacks {', '.join(missing)}")
        if config.num_experts_per_tok > config.num_experts:
            raise NinferError(
                f"num_experts_per_tok ({config.num_experts_per_tok}) exceeds num_experts ({config.num_experts})"
            )
        CausalLM.__init__(self, config)

        self.model = LlamaModel(config, self.qk_norm, lambda i: make_mlp(config, config.is_sparse_layer(i)))
        self.make_lm_head(self.model.embed_tokens)
