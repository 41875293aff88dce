"""Qwen3-MoE: Qwen3 (Llama + q/k norm) whose sparse layers' MLP is a mixture of experts (engine/layers/moe.py)."""

from __future__ import annotations

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.layers.moe import EXPERT_TENSOR, SparseMoE
from engine.models.base import CausalLM
from engine.models.llama import GatedMLP, LlamaForCausalLM, LlamaModel


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

        def mlp_for(layer: int):
            if config.is_sparse_layer(layer):
                return SparseMoE(config)
            return GatedMLP(config.hidden_size, config.intermediate_size)

        self.model = LlamaModel(config, self.qk_norm, mlp_for)
        self.make_lm_head(self.model.embed_tokens)

    def param_for(self, ckpt_name: str) -> tuple[str, str | None] | None:
        expert = EXPERT_TENSOR.match(ckpt_name)
        if expert is None:
            return super().param_for(ckpt_name)
        base, index, kind = expert.groups()
        param = "down_proj" if kind == "down" else "gate_up_proj"
        return f"{base}.{param}", f"{kind}:{index}"
