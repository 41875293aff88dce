from __future__ import annotations

from engine.config import ModelConfig
from engine.models.base import CausalLM
from engine.models.llama import LlamaForCausalLM, Qwen3ForCausalLM
from engine.models.qwen3_5 import Qwen3_5ForCausalLM

MODELS: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "qwen3_5": Qwen3_5ForCausalLM,
}


def model_class(config: ModelConfig) -> type[CausalLM]:
    return MODELS[config.family]
