"""Models `ninfer plan` knows by name, without weights: their config.json shapes, and the recipe a
single-GPU user would run them with. `default` is the embedded model, read from its own file."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig
from engine.errors import NinferError

_QWEN35_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "num_position_embeddings": 2304,
}


def _qwen35(
    hidden: int, layers: int, inter: int | None, heads: int, linear_v_heads: int, kv_heads: int = 4
) -> dict:
    """A Qwen3.5 checkpoint's config.json; `inter` None: no dense MLP width (a mixture of experts')."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "vision_config": {**_QWEN35_VISION, "out_hidden_size": hidden},
        "text_config": {
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            **({"intermediate_size": inter} if inter is not None else {}),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": 256,
            "full_attention_interval": 4,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": linear_v_heads,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "vocab_size": 248320,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6,
            "mtp_num_hidden_layers": 1,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e7,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
            },
            "dtype": "bfloat16",
        },
    }


def _qwen35_moe() -> dict:
    config = _qwen35(2048, 40, None, 16, 32, kv_heads=2)
    config["text_config"] |= {
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
    }
    return config | {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}


def _dense(arch: str, hidden: int, layers: int, inter: int, heads: int, kv: int, vocab: int, ctx: int, **kw):
    return {
        "architectures": [arch],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 128,
        "vocab_size": vocab,
        "max_position_embeddings": ctx,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **kw,
    }


_CONFIGS = {
    "qwen3.5-27b": _qwen35(5120, 64, 17408, 24, 48),
    "qwen3.5-9b": _qwen35(4096, 32, 12288, 16, 32),
    # Qwen3.5-35B-A3B (and Qwen3.6-35B-A3B, the same shapes): the hybrid with every layer a mixture of 256
    # experts of width 512, 8 a token, and a shared expert; its config.json names no dense MLP width
    "qwen3.5-35b-a3b": _qwen35_moe(),
    "qwen3-32b": _dense("Qwen3ForCausalLM", 5120, 64, 25600, 64, 8, 151936, 40960, rope_theta=1e6),
    "qwen3-8b": _dense("Qwen3ForCausalLM", 4096, 36, 12288, 32, 8, 151936, 40960, rope_theta=1e6),
    # the small Qwen3 models: draft models for the dense ones (--spec draft)
    "qwen3-1.7b": _dense(
        "Qwen3ForCausalLM", 2048, 28, 6144, 16, 8, 151936, 40960, rope_theta=1e6, tie_word_embeddings=True
    ),
    "qwen3-0.6b": _dense(
        "Qwen3ForCausalLM", 1024, 28, 3072, 16, 8, 151936, 40960, rope_theta=1e6, tie_word_embeddings=True
    ),
    # Qwen2.5-Coder: the fill-in-the-middle models editor completion runs (Qwen2: biased q / k / v)
    "qwen2.5-coder-7b": _dense("Qwen2ForCausalLM", 3584, 28, 18944, 28, 4, 152064, 32768, rope_theta=1e6),
    "qwen2.5-coder-1.5b": _dense(
        "Qwen2ForCausalLM", 1536, 28, 8960, 12, 2, 151936, 32768, rope_theta=1e6, tie_word_embeddings=True
    ),
    # Qwen3-30B-A3B-2507 and Qwen3-Coder-30B-A3B: 128 experts of width 768 a layer, 8 a token
    "qwen3-30b-a3b": _dense(
        "Qwen3MoeForCausalLM",
        2048,
        48,
        6144,
        32,
        4,
        151936,
        262144,
        rope_theta=1e7,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
    # Qwen3-VL-30B-A3B (Instruct, Thinking): Qwen3-30B-A3B's layers with M-RoPE, and a vision tower whose
    # blocks 8, 16 and 24 feed deepstack levels into the first three layers (--vision)
    "qwen3-vl-30b-a3b": {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "model_type": "qwen3_vl_moe",
        "tie_word_embeddings": False,
        "vision_config": {**_QWEN35_VISION, "out_hidden_size": 2048, "deepstack_visual_indexes": [8, 16, 24]},
        "text_config": {
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "intermediate_size": 6144,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 768,
            "vocab_size": 151936,
            "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
            "rope_theta": 5e6,
            "dtype": "bfloat16",
        },
    },
    # Qwen3-Next-80B-A3B (Instruct, Thinking; Qwen3-Coder-Next has its shapes): the hybrid of Qwen3.5 with 512
    # experts of width 512 a layer, 10 a token, and a shared expert; an MTP head
    "qwen3-next-80b-a3b": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "intermediate_size": 5120,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "norm_topk_prob": True,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "mtp_num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "llama-3.1-8b": _dense(
        "LlamaForCausalLM",
        4096,
        32,
        14336,
        32,
        8,
        128256,
        131072,
        rope_theta=5e5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}
_CONFIGS["qwen3-coder-next"] = _CONFIGS["qwen3-next-80b-a3b"]
_CONFIGS["qwen3.6-35b-a3b"] = _CONFIGS["qwen3.5-35b-a3b"]
PRESETS = (*_CONFIGS, "default")


@dataclass(frozen=True)
class Preset:
    name: str
    config: ModelConfig
    recipe: str  # what the weights are counted at unless --recipe / --bits says otherwise


def preset(name: str) -> Preset:
    """A preset of _CONFIGS (`default`, the embedded GGUF, is read from its file by engine/plan/model.py)."""
    key = name.lower()
    if key not in _CONFIGS:
        raise NinferError(f"unknown preset '{name}'; the presets are {', '.join(PRESETS)}")
    return Preset(key, ModelConfig.from_hf_dict(_CONFIGS[key]), "q4.6")
