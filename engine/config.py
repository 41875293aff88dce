"""Frozen configuration, built once at the edge (CLI, LLM()) and passed down."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from engine.cache.kv_layout import resolve_kv_dtype
from engine.chat_template import parse_template_kwargs
from engine.errors import NinferError
from engine.lora.spec import lora_modules
from engine.rope_scaling import (
    check_rope_scaling,
    parse_rope_scaling,
    position_limit,
    positions_phrase,
    stretch_hint,
    with_defaults,
)
from engine.sampling_defaults import parse_overrides
from engine.sizes import parse_size

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3ForSequenceClassification",
    "Qwen3Model",
    "Qwen3MoeForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
)
# the Qwen3.5 hybrid's layout (Gated DeltaNet layers, every full_attention_interval-th one full attention,
# 0.25 of each head rotary); Qwen3-Next's checkpoints split their fused projections as they load
# (engine/formats/qwen3_next.py)
HYBRID_PREFIXES = ("Qwen3_5", "Qwen3Next")

BARE_ARCHITECTURES = ("Qwen3Model",)  # transformers' decoder without an LM head (Qwen3-Embedding)
# a decoder with a classifier in place of the LM head (a Qwen3-Reranker converted to score `yes` - `no`)
CLASSIFIER_ARCHITECTURES = ("Qwen3ForSequenceClassification",)
WEIGHT_QUANT_MODES = ("auto", "none", "int8", "int4")
SPEC_METHODS = ("none", "ngram", "mtp", "draft")
MAX_DRAFT_TOKENS = 16
# Predicted Outputs: drafts of the client's prediction per step, by default and at most (a step of 1 + N
# tokens costs little more than one while decoding is bandwidth-bound)
DEFAULT_PREDICTION_TOKENS, MAX_PREDICTION_TOKENS = 16, 64
LM_HEAD_DRAFT_TOKENS = 32768  # --lm-head-draft: the token ids the MTP head's drafts are chosen from
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# other spellings of the same dtypes (vLLM's half / float, the KV dtypes' short names)
DTYPE_ALIASES = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
}


def resolve_dtype(dtype: str, device: str) -> str:
    """auto: bfloat16 on a GPU (float16 on one without bf16: before SM 8.0), float32 on the CPU (whose
    16-bit matmuls are emulated on most CPUs); an alias: its DTYPES name."""
    if dtype == "auto":
        if device == "cpu":
            return "float32"
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported(including_emulation=False):
            return "float16"
        return "bfloat16"
    return DTYPE_ALIASES.get(dtype, dtype)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and hyper-parameters of a checkpoint, independent of the file format it came from."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias: bool = False  # bias on the q / k / v projections only (Qwen2); attention_bias: on o_proj too
    partial_rotary_factor: float = 1.0
    rope_scaling: dict[str, Any] | None = None
    # M-RoPE (multimodal checkpoints): rotary frequencies per position axis (time, row, column), and whether
    # they alternate (engine/vision/mrope.py); text-only prompts have the same position on every axis
    mrope_section: tuple[int, ...] = ()
    mrope_interleaved: bool = False
    # full_attention / linear_attention per layer (hybrid Qwen3.5); all full_attention otherwise
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    checkpoint_dtype: str = "float32"
    mtp_num_hidden_layers: int = 0  # multi-token-prediction layers shipped for speculative decoding
    # mixture of experts (Qwen3-MoE): experts per sparse layer, chosen per token, each expert's MLP width;
    # sparse layers are every decoder_sparse_step-th one not in mlp_only_layers (those keep a dense MLP of
    # intermediate_size); norm_topk_prob renormalises the chosen experts' router probabilities to sum to 1
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0  # Qwen3.5-MoE: the shared expert's MLP width (0: none)
    # the multimodal checkpoint's vision tower (transformers' vision_config), None when there is none
    vision_config: dict[str, Any] | None = field(default=None, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # an embedding model (a bare decoder: transformers' Qwen3Model, or a GGUF with a pooling type): it makes
    # embeddings, not text; a checkpoint saved without the "model." prefix is one too (found at load)
    embedding_model: bool = False
    # a reranker (engine/rerank.py): "yes_no", a causal LM judging a query-document pair by its next token
    # (Qwen3-Reranker); "classifier", a head of its own over the last token (score / cls.output, kept apart
    # from the decoder, which is then headless); "" otherwise
    rerank: str = ""
    rerank_labels: tuple[str, ...] = ()  # the classifier's labels, in its rows' order (may be unnamed)
    # the checkpoint's own pair prompt with {query} and {document} (a GGUF's tokenizer.chat_template.rerank)
    rerank_template: str | None = field(default=None, compare=False)

    @property
    def family(self) -> str:
        """The model implementation: llama (Llama), qwen3 (Llama + q/k norm), qwen3_5 (hybrid); the MoE
        models are their family's (each layer's MLP follows is_sparse_layer)."""
        return {
            "LlamaForCausalLM": "llama",
            "Qwen2ForCausalLM": "llama",  # Llama with biased q / k / v projections (Qwen2.5, Qwen2.5-Coder)
            "Qwen3ForCausalLM": "qwen3",
            "Qwen3ForSequenceClassification": "qwen3",
            "Qwen3Model": "qwen3",
            "Qwen3MoeForCausalLM": "qwen3",
            "Qwen3_5ForCausalLM": "qwen3_5",
            "Qwen3_5ForConditionalGeneration": "qwen3_5",
            "Qwen3_5MoeForCausalLM": "qwen3_5",
            "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
            "Qwen3NextForCausalLM": "qwen3_5",
            "Qwen3VLForConditionalGeneration": "qwen3",
            "Qwen3VLMoeForConditionalGeneration": "qwen3",  # Qwen3-MoE's layers
        }[self.architecture]

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` has a mixture-of-experts MLP (transformers' Qwen3-MoE rule)."""
        step = self.decoder_sparse_step
        return self.num_experts > 0 and layer not in self.mlp_only_layers and (layer + 1) % step == 0

    @property
    def num_full_attention_layers(self) -> int:
        return sum(t == "full_attention" for t in self.layer_types)

    @property
    def num_linear_attention_layers(self) -> int:
        return sum(t == "linear_attention" for t in self.layer_types)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def position_limit(self) -> int:
        """The positions the model takes: max_position_embeddings, or what YaRN stretches them to."""
        return position_limit(self.rope_scaling, self.max_position_embeddings)

    def with_rope_scaling(self, scaling: dict[str, Any] | None, where: str = "--rope-scaling") -> ModelConfig:
        """This config with another rope scaling (None: unscaled), checked; YaRN's original context
        defaults to max_position_embeddings."""
        if scaling is not None:
            check_rope_scaling(scaling, where)
        return replace(self, rope_scaling=with_defaults(scaling, self.max_position_embeddings))

    def with_rope_scaling_flag(self, flag: str | None) -> ModelConfig:
        """This config under `--rope-scaling FLAG` (engine/rope_scaling.py); unchanged without the flag."""
        return self if flag is None else self.with_rope_scaling(parse_rope_scaling(flag))

    @staticmethod
    def from_hf_dict(cfg: dict[str, Any]) -> ModelConfig:
        """Build from a transformers config.json dict (text_config is used for multimodal wrappers)."""
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(cfg.get("model_type", ""))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise NinferError(
                f"unsupported architecture '{arch}'; ninfer supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if cfg.get("use_sliding_window"):
            raise NinferError(
                f"this {arch} config turns sliding-window attention on (use_sliding_window), which ninfer "
                "does not run; set it to false (Qwen2.5 checkpoints ship it off)"
            )
        text = dict(cfg.get("text_config") or cfg)
        rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
        rope_theta = text.get("rope_theta", rope.get("rope_theta", 10000.0))
        partial = text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        mrope = ("mrope_section", "mrope_interleaved")
        scaling = (
            None
            if rope_type == "default"
            else {k: v for k, v in rope.items() if k != "rope_theta" and k not in mrope}
        )
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers"):
            if not isinstance(text.get(name), int):
                raise NinferError(f"this {arch} config.json lacks {name}; give the model's own config.json")
        num_heads = text["num_attention_heads"]
        head_dim = text.get("head_dim") or text["hidden_size"] // num_heads
        num_layers = text["num_hidden_layers"]
        layer_types = text.get("layer_types")
        if arch.startswith(HYBRID_PREFIXES) and not layer_types:
            interval = text.get("full_attention_interval", 4)
            layer_types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
            ]
        layer_types = tuple(layer_types or ("full_attention",) * num_layers)
        if arch.startswith(HYBRID_PREFIXES) and partial == 1.0 and "partial_rotary_factor" not in rope:
            partial = 0.25
        eos = text.get("eos_token_id", cfg.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        bare = arch in BARE_ARCHITECTURES
        classifier = arch in CLASSIFIER_ARCHITECTURES
        config = ModelConfig(
            architecture=arch,
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=_dense_mlp_width(text, arch),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=text.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=text.get("max_position_embeddings", 4096),
            # a bare decoder (or a classifier's) has no LM head of its own
            tie_word_embeddings=bool(tie) or bare or classifier,
            attention_bias=bool(text.get("attention_bias", False)),
            qkv_bias=arch == "Qwen2ForCausalLM",
            partial_rotary_factor=float(partial),
            rope_scaling=scaling,
            mrope_section=tuple(rope.get("mrope_section") or ()),
            mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
            layer_types=layer_types,
            linear_num_key_heads=text.get("linear_num_key_heads", 0),
            linear_num_value_heads=text.get("linear_num_value_heads", 0),
            linear_key_head_dim=text.get("linear_key_head_dim", 0),
            linear_value_head_dim=text.get("linear_value_head_dim", 0),
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 0),
            bos_token_id=text.get("bos_token_id", cfg.get("bos_token_id")),
            eos_token_ids=eos_ids,
            checkpoint_dtype=str(text.get("dtype") or text.get("torch_dtype") or "float32"),
            mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0) or 0),
            num_experts=int(text.get("num_experts", text.get("num_local_experts", 0)) or 0),
            num_experts_per_tok=int(text.get("num_experts_per_tok", 0) or 0),
            moe_intermediate_size=int(text.get("moe_intermediate_size", 0) or 0),
            # Qwen3.5-MoE's config has no such key; Qwen3-VL-MoE's router renormalises whatever it says
            norm_topk_prob=arch.startswith("Qwen3VLMoe")
            or bool(text.get("norm_topk_prob", arch.startswith(("Qwen3_5Moe", "Qwen3Next")))),
            decoder_sparse_step=int(text.get("decoder_sparse_step", 1) or 1),
            mlp_only_layers=tuple(text.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=int(text.get("shared_expert_intermediate_size", 0) or 0),
            vision_config=_vision_config(cfg),
            embedding_model=bare or classifier,
            rerank="classifier" if classifier else "",
            rerank_labels=_labels(cfg) if classifier else (),
        )
        if "Moe" in arch:
            _check_experts(config)
        if scaling is not None:
            config = config.with_rope_scaling(scaling, "config.json's rope_scaling")
        return config


def _vision_config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """transformers' vision_config with the placeholder token ids the wrapper config holds."""
    vision = cfg.get("vision_config")
    if not vision:
        return None
    ids = ("image_token_id", "vision_start_token_id", "vision_end_token_id")
    return {**vision, **{k: cfg[k] for k in ids if k in cfg}}


def _labels(cfg: dict[str, Any]) -> tuple[str, ...]:
    """A sequence classifier's labels in row order (transformers' id2label; num_labels unnamed ones)."""
    names = cfg.get("id2label") or {}
    count = int(cfg.get("num_labels") or len(names) or 2)
    return tuple(str(names.get(str(i), names.get(i, f"LABEL_{i}"))) for i in range(count))


def _dense_mlp_width(text: dict[str, Any], arch: str) -> int:
    """intermediate_size: a dense MLP's width. Qwen3.5-MoE's config.json (Qwen3.5 / Qwen3.6-35B-A3B) has
    none, every layer being a mixture of experts: the widest expert MLP (routed or shared) stands for it
    where it is read (the activations' size)."""
    width = text.get("intermediate_size")
    if isinstance(width, int) and width > 0:
        return width
    experts = [int(text.get(k) or 0) for k in ("moe_intermediate_size", "shared_expert_intermediate_size")]
    if int(text.get("num_experts") or 0) and max(experts) and not text.get("mlp_only_layers"):
        return max(experts)
    raise NinferError(f"this {arch} config.json lacks intermediate_size; give the model's own config.json")


def _check_experts(config: ModelConfig) -> None:
    """A mixture-of-experts config names its experts; refused in a sentence otherwise."""
    fields = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
    missing = [name for name in fields if getattr(config, name) <= 0]
    if missing:
        raise NinferError(f"this {config.architecture} config.json lacks {', '.join(missing)}")
    if config.num_experts_per_tok > config.num_experts:
        raise NinferError(
            f"num_experts_per_tok ({config.num_experts_per_tok}) exceeds num_experts ({config.num_experts})"
        )


def _arch_from_model_type(model_type: str) -> str:
    return {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "qwen3_5_text": "Qwen3_5ForCausalLM",
        "qwen3_5": "Qwen3_5ForConditionalGeneration",
        "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
        "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
        "qwen3_next": "Qwen3NextForCausalLM",
        "qwen3_vl": "Qwen3VLForConditionalGeneration",
        "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",
    }.get(model_type, model_type or "<none>")


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler needs, resolved against the model (see EngineConfig for the meaning)."""

    max_concurrency: int = 4
    prefill_chunk: int = 2048
    max_context: int = 4096
    max_pending: int | None = None
    pending_timeout_ms: float | None = None
    state_snapshot_interval: int = 0  # a multiple of the block size; 0 = no interval snapshots
    # the chat template's turn-start token (ChatML's <|im_start|>), -1 = none: hybrid models also snapshot the
    # state where a prompt's second turn starts (after its system prompt and tools) and where the turn before
    # its last one starts (before its last message), page-aligned
    turn_token_id: int = -1
    num_draft_tokens: int = 0  # draft tokens verified per decode step; 0 = no speculative decoding
    # of a request's prediction (Predicted Outputs), at most this many drafted a step (>= num_draft_tokens)
    num_prediction_tokens: int = 0
    spec: str = "none"  # where drafts come from: ngram (engine/spec/ngram.py) or mtp (the runner's MTP head)
    # decode steps replay CUDA graphs: a step whose requests would verify different draft counts pads the
    # shorter ones to the longest, so it has a graph (Scheduler._pad_drafts)
    pad_drafts: bool = False
    cache_reuse: int = 0  # shortest run of shifted tokens taken from an earlier sequence; 0 = off

    @property
    def most_prediction_drafts(self) -> int:
        """Drafts a prediction may give a step: num_prediction_tokens, never fewer than num_draft_tokens."""
        return max(self.num_prediction_tokens, self.num_draft_tokens)


def check_device_visible(device: str) -> None:
    """A CUDA device asked for is there (said before anything loads: serve checks it before binding its
    port, LLM before reading the weights)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise NinferError(f"device {device} was asked for but no CUDA device is visible; use cpu")


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model. Field names are the `ninfer serve` flags (--max-context, ...)."""

    model: str
    device: str = "cpu"
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on the CPU (resolve_dtype)
    kv_dtype: str = "auto"  # auto = the model dtype; see engine/cache/kv_layout.py
    # weight-only quantization of linear layers: auto = as the checkpoint stores them (on the CPU a 4-bit
    # GGUF tensor runs as int4, an 8-bit one as int8), none, int8 or int4: on the CPU its int8 / int4 kernels
    # (engine/quant/cpu.py); where the fused kernels run (a GPU), a 16-bit checkpoint quantized at load
    # into packed 8- / 4-bit groups of 128 (engine/quant/on_load.py)
    weight_quant: str = "auto"
    # KV pool in tokens; None: room for min(max_concurrency, 2) full contexts; "auto": sized from the memory
    # free after loading (engine/plan/runtime.py)
    kv_capacity: int | str | None = None
    max_context: int | None = None  # None: the model's positions (position_limit), capped at 32K on CPU
    # the model's rope scaling replaced (engine/rope_scaling.py): yarn:FACTOR[:ORIGINAL_CONTEXT], none, or
    # a config.json-style JSON object; None keeps the checkpoint's
    rope_scaling: str | None = None
    # the sampling defaults of the fields a request leaves out (engine/sampling_defaults.py): auto = the
    # checkpoint's generation_config.json (or GGUF general.sampling.*), none = ninfer's own, or a file
    generation_config: str = "auto"
    # sampling fields laid over the generation config's (vLLM's --override-generation-config): a JSON object
    # or a dict, e.g. {"temperature": 0.6}; kept as (field, value) pairs
    override_generation_config: Any = ()
    chat_template: str | None = None  # a Jinja file replacing the checkpoint's chat template
    # chat template variables every render takes unless the request gives its own (vLLM's
    # --default-chat-template-kwargs): a JSON object or a dict, e.g. {"enable_thinking": false}; kept as pairs
    chat_template_kwargs: Any = ()
    max_concurrency: int = 8  # requests running at once
    max_pending: int | None = None  # requests waiting for admission; beyond, add_request is refused
    pending_timeout_ms: float | None = None  # a request waiting longer than this expires
    prefill_chunk: int = 2048  # tokens per engine step, shared by decode and prompt chunks
    enable_prefix_caching: bool = True
    # llama-server's --cache-reuse: a new prompt's tokens past its cached prefix that an earlier sequence
    # holds further along (the earlier one had tokens the new one dropped: an editor's window that slid)
    # are taken from that sequence's pages in runs of at least this many tokens, their keys rotated to the
    # new positions (engine/cache/kv_shift.py); 0 = off. Attention-only models, prefix caching on
    cache_reuse: int = 0
    # bytes of host memory for the prefix cache's second tier (engine/cache/host_pool.py): KV pages evicted
    # from the GPU pool are kept there and copied back for a later request with the same prefix; 0 = off
    host_cache: int = 0
    # a file the prefix cache is kept in across restarts: written at shutdown and on falling asleep idle
    # (LLM.save_prefix_cache, when the cache changed), read into the host tier at start-up when it was
    # written for the same model and KV layout (engine/worker/prefix_file.py); needs host_cache
    prefix_cache_file: str | None = None
    # the server sleeps after this many seconds without work (llama-server's --sleep-idle-seconds): the
    # device memory given back, the weights and KV pool held in host memory, until the next request
    # (engine/worker/sleep.py); None: never
    sleep_idle_seconds: float | None = None
    state_snapshot_interval: int = 4096  # hybrid models: snapshot the recurrent state every N tokens
    state_snapshots: int | None = None  # hybrid models: snapshot slots; None: 2 x max_concurrency + 2
    # hybrid models: snapshots evicted from those slots kept in host memory (the prefix cache's host tier,
    # engine/cache/state_pool.py) and copied back for a later request that resumes there; None: an eighth of
    # host_cache (taken from it), or without host_cache three times the GPU snapshot slots; 0: off
    host_state_snapshots: int | None = None
    block_size: int = 16
    cuda_graphs: bool = True  # CUDA: decode steps replay captured graphs (engine/worker/cuda_graphs.py)
    # speculative decoding: none; ngram (drafts from earlier occurrences of the last tokens: prompt lookup,
    # engine/spec/ngram.py); or mtp (the model's multi-token-prediction head, engine/spec/mtp.py);
    # verified `draft_tokens` at a time
    spec: str = "none"
    draft_tokens: int = 3
    # with spec on, a request's prediction (OpenAI's Predicted Outputs) drafts up to this many tokens a step
    # where the output follows it (None: the larger of draft_tokens and DEFAULT_PREDICTION_TOKENS); steps
    # with more drafts than the CUDA graphs' draft_tokens run eagerly
    prediction_tokens: int | None = None
    # spec draft: the small model whose greedy tokens are the drafts (an HF directory, .gguf or .ninfer of the
    # same vocabulary: Qwen3-0.6B for a Qwen3-32B); its KV pages are the target's pages (engine/spec/draft_model.py)
    draft_model: str | None = None
    # spec mtp: the head's drafts score only the first N token ids of the vocabulary (a BPE vocabulary
    # lists tokens in merge order, the most frequent first); 0 = the whole lm_head. Verification always
    # uses the whole head, so output is unchanged; only the drafts' cost (and reach) shrink
    lm_head_draft: int = 0
    # prefill-sized matmuls of packed 4/6/8-bit weights multiply int8 activations (quantized per token and
    # weight group) on the int8 tensor cores (kernels/int8_matmul); decode keeps 16-bit activations
    int8_prefill: bool = False
    # load the vision tower: requests may carry images (engine/vision); its weights and activations are in
    # the memory ledger
    vision: bool = False
    # a GGUF model's vision tower in llama.cpp's mmproj file (engine/formats/gguf_mmproj.py); implies vision
    mmproj: str | None = None
    # score query-document pairs with a causal LM's `yes` / `no` next-token logits (engine/rerank.py), for a
    # Qwen3-Reranker checkpoint ninfer does not recognise as one by itself
    rerank: bool = False
    # GPU: the most of the device's memory this engine takes, weights and KV pool and all (vLLM's
    # --gpu-memory-utilization, 0 < f <= 1); None: all that is free after loading
    gpu_memory_utilization: float | None = None
    # CPU threads for the engine's matmuls (torch.set_num_threads; llama.cpp's --threads); None: torch's
    threads: int | None = None
    # LoRA adapters served beside the base model (engine/lora): (name, PEFT folder) pairs; "NAME=PATH"
    # strings or a {name: path} mapping are taken too. A request runs one by naming it as its model
    lora_modules: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise NinferError(f"unknown device '{self.device}'; use cpu, or cuda (cuda:N for the N-th GPU)")
        if self.device.startswith("cuda:") and int(self.device[5:]) >= torch.cuda.device_count():
            raise NinferError(
                f"device {self.device} is not here: this machine has {torch.cuda.device_count()} CUDA "
                "device(s), numbered from 0"
            )
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype, self.device))
        if self.dtype not in DTYPES:
            raise NinferError(f"unknown dtype '{self.dtype}'; use auto or one of {', '.join(DTYPES)}")
        # auto: the model dtype, which kv_layout accepts as an alias (float32 -> fp32, ...)
        kv = self.dtype if self.kv_dtype == "auto" else self.kv_dtype
        object.__setattr__(self, "kv_dtype", resolve_kv_dtype(kv, self.device))
        if self.weight_quant not in WEIGHT_QUANT_MODES:
            raise NinferError(
                f"unknown weight_quant '{self.weight_quant}'; use one of {', '.join(WEIGHT_QUANT_MODES)}"
            )
        # sizes as the CLI writes them ("180k", "32G") are taken from the Python API too
        for name in ("max_context", "kv_capacity", "host_cache"):
            value = getattr(self, name)
            if isinstance(value, str) and not (name == "kv_capacity" and value == "auto"):
                object.__setattr__(self, name, parse_size(value, name))
        for name in (
            "block_size",
            "max_concurrency",
            "prefill_chunk",
            "max_context",
            "kv_capacity",
            "host_cache",
        ):
            value = getattr(self, name)
            if value is None or (name == "kv_capacity" and value == "auto"):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise NinferError(f"{name} must be a whole number (got {value!r})")
            if value <= 0 and name != "host_cache":
                flag = "" if name == "block_size" else f" (--{name.replace('_', '-')})"  # (a serve flag too)
                raise NinferError(f"{name}{flag} must be positive (got {value})")
        if self.device != "cpu" and self.block_size & (self.block_size - 1):
            raise NinferError(
                f"block_size must be a power of two on {self.device}: the attention kernels read whole "
                f"pages per tile (got {self.block_size}; 16 is the default)"
            )
        if isinstance(self.kv_capacity, int) and self.kv_capacity <= 0:
            raise NinferError(f"kv_capacity must be positive (got {self.kv_capacity})")
        pool = self.whole_pages(self.kv_capacity) if isinstance(self.kv_capacity, int) else None
        if pool is not None and self.max_context is not None and pool < self.max_context:
            raise NinferError(
                f"--kv-capacity {self.kv_capacity} holds fewer tokens than --max-context {self.max_context}, so a "
                f"request as long as the context could never run; raise --kv-capacity to {self.max_context} or "
                f"more (ninfer plan shows what fits), or lower --max-context to {pool}"
            )
        if self.host_cache < 0:
            raise NinferError(f"host_cache must be 0 (off) or a number of bytes (got {self.host_cache})")
        if self.host_cache and not self.enable_prefix_caching:
            raise NinferError("host_cache is the prefix cache's second tier; it needs prefix caching on")
        if (
            isinstance(self.cache_reuse, bool)
            or not isinstance(self.cache_reuse, int)
            or self.cache_reuse < 0
        ):
            raise NinferError(f"cache_reuse must be 0 (off) or a number of tokens (got {self.cache_reuse!r})")
        if self.cache_reuse and not self.enable_prefix_caching:
            raise NinferError("--cache-reuse takes the prefix cache's pages; it needs prefix caching on")
        if self.cache_reuse and self.spec == "draft":
            raise NinferError(
                "--cache-reuse with --spec draft: the draft model's keys would need rotating too; use --spec "
                "ngram, or leave --cache-reuse out"
            )
        if self.prefix_cache_file is not None:
            object.__setattr__(self, "prefix_cache_file", str(self.prefix_cache_file))
            if not self.host_cache:
                raise NinferError(
                    "--prefix-cache-file is read into the prefix cache's host tier at start-up; give --host-cache "
                    "SIZE too (e.g. --host-cache 16G)"
                )
            folder = Path(self.prefix_cache_file).expanduser().resolve().parent
            if not folder.is_dir() or not os.access(folder, os.W_OK):
                raise NinferError(
                    f"--prefix-cache-file {self.prefix_cache_file}: the folder {folder} is not there or not "
                    "writable; give a path in a writable folder"
                )
        if self.sleep_idle_seconds is not None and (
            isinstance(self.sleep_idle_seconds, bool)
            or not isinstance(self.sleep_idle_seconds, (int, float))
            or not self.sleep_idle_seconds > 0
        ):
            raise NinferError(
                f"sleep_idle_seconds must be a positive number of seconds (got {self.sleep_idle_seconds!r}); "
                "leave it out to stay awake"
            )
        if self.prefill_chunk < self.max_concurrency:
            raise NinferError(
                f"prefill_chunk ({self.prefill_chunk}) must be at least max_concurrency ({self.max_concurrency}): "
                "every running request needs one token of each step's budget"
            )
        if self.rope_scaling is not None:
            parse_rope_scaling(self.rope_scaling)  # refused here, in a sentence, before anything loads
        if self.spec not in SPEC_METHODS:
            raise NinferError(f"unknown spec '{self.spec}'; use one of {', '.join(SPEC_METHODS)}")
        if self.spec != "none" and not 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS:
            raise NinferError(
                f"draft_tokens must be between 1 and {MAX_DRAFT_TOKENS} (got {self.draft_tokens}); 3 to 5 "
                "suits n-gram drafts"
            )
        if self.prediction_tokens is not None and self.spec == "none":
            raise NinferError(
                "prediction_tokens sets how far a request's prediction drafts, which needs speculative decoding; "
                "add --spec ngram (or mtp, draft), or drop --prediction-tokens"
            )
        if self.prediction_tokens is not None and not 1 <= self.prediction_tokens <= MAX_PREDICTION_TOKENS:
            raise NinferError(
                f"prediction_tokens must be between 1 and {MAX_PREDICTION_TOKENS} (got {self.prediction_tokens}); "
                f"the default, {DEFAULT_PREDICTION_TOKENS}, drafts a prediction that far ahead each step"
            )
        if self.spec == "draft" and not self.draft_model:
            raise NinferError(
                "spec draft needs a draft model (--draft-model PATH: a small model of the same family)"
            )
        if self.mmproj:
            object.__setattr__(self, "vision", True)
        if self.spec == "draft" and self.vision:
            images = "--mmproj" if self.mmproj else "--vision"
            raise NinferError(f"a draft model drafts text; drop {images}, or use --spec ngram with images")
        if self.draft_model and self.spec != "draft":
            raise NinferError(
                f"a draft model drafts with spec draft (got spec {self.spec}); add --spec draft"
            )
        if self.lm_head_draft < 0:
            raise NinferError(
                f"lm_head_draft must be >= 0, 0 meaning the whole head (got {self.lm_head_draft})"
            )
        if self.lm_head_draft and self.spec != "mtp":
            raise NinferError(
                "lm_head_draft narrows the MTP head's drafts; use it with spec mtp (or drop it)"
            )
        object.__setattr__(self, "lora_modules", lora_modules(self.lora_modules))
        object.__setattr__(
            self, "override_generation_config", parse_overrides(self.override_generation_config)
        )
        object.__setattr__(self, "chat_template_kwargs", parse_template_kwargs(self.chat_template_kwargs))
        utilization = self.gpu_memory_utilization
        if utilization is not None and (
            isinstance(utilization, bool)
            or not isinstance(utilization, (int, float))
            or not 0 < utilization <= 1
        ):
            raise NinferError(
                f"gpu_memory_utilization is a fraction of the GPU's memory, above 0 and at most 1 (got {utilization!r})"
            )
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise NinferError(f"threads must be a whole number of 1 or more (got {self.threads!r})")
        for name in (
            "max_pending",
            "pending_timeout_ms",
            "state_snapshots",
            "state_snapshot_interval",
            "host_state_snapshots",
        ):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise NinferError(f"{name} must be >= 0 (got {value})")
        if self.host_state_snapshots and not self.enable_prefix_caching:
            raise NinferError(
                "--host-state-snapshots keeps the prefix cache's state snapshots; it needs prefix caching on"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def resolved_max_context(self, model_config: ModelConfig) -> int:
        limit = model_config.position_limit
        if self.max_context is None:
            return min(limit, 32768) if self.device == "cpu" else limit
        if self.max_context > limit:
            scaling, positions = model_config.rope_scaling, model_config.max_position_embeddings
            raise NinferError(
                f"max_context {self.max_context} is beyond the model's {positions_phrase(scaling, positions)}; "
                f"use max_context {limit} or less{stretch_hint(self.max_context, scaling, positions)}"
            )
        return self.max_context

    def resolved_kv_capacity(self, model_config: ModelConfig) -> int:
        """KV pool size in tokens, a whole number of blocks."""
        tokens = self.kv_capacity if isinstance(self.kv_capacity, int) else None
        tokens = tokens or self.resolved_max_context(model_config) * min(self.max_concurrency, 2)
        return self.whole_pages(tokens)

    def whole_pages(self, tokens: int) -> int:
        """`tokens` rounded up to whole KV pages."""
        return math.ceil(tokens / self.block_size) * self.block_size

    @property
    def num_state_snapshots(self) -> int:
        if not self.enable_prefix_caching:
            return 0
        return 2 * self.max_concurrency + 2 if self.state_snapshots is None else self.state_snapshots

    def scheduler_config(self, max_context: int, turn_token_id: int = -1) -> SchedulerConfig:
        """max_context: as resolved at start-up (engine/plan/runtime.py: `auto` may set it from the pool);
        turn_token_id: the tokenizer's turn-start token (SchedulerConfig.turn_token_id)."""
        interval = self.state_snapshot_interval // self.block_size * self.block_size
        return SchedulerConfig(
            max_concurrency=self.max_concurrency,
            prefill_chunk=self.prefill_chunk,
            max_context=max_context,
            max_pending=self.max_pending,
            pending_timeout_ms=self.pending_timeout_ms,
            state_snapshot_interval=interval if self.enable_prefix_caching else 0,
            turn_token_id=turn_token_id,
            num_draft_tokens=self.num_draft_tokens,
            num_prediction_tokens=self.num_prediction_tokens,
            spec=self.spec,
            pad_drafts=self.cuda_graphs and self.device != "cpu" and self.num_draft_tokens > 0,
            cache_reuse=self.cache_reuse,
        )

    @property
    def num_draft_tokens(self) -> int:
        """Draft tokens verified per decode step; 0 without speculative decoding."""
        return self.draft_tokens if self.spec != "none" else 0

    @property
    def num_prediction_tokens(self) -> int:
        """Draft tokens a request's prediction may give a step (at least num_draft_tokens); 0 without spec."""
        if self.spec == "none":
            return 0
        asked = self.prediction_tokens or DEFAULT_PREDICTION_TOKENS
        return max(asked, self.draft_tokens)
