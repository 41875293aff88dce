"""A GGUF file (llama.cpp): metadata -> ModelConfig, BPE tokenizer, dequantized tensors with HF names."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats import gguf_blocks, gguf_moe, gguf_qwen35, qwen3_next
from engine.formats.gguf_file import GGUFFile
from engine.formats.source import ModelSource, WeightIterator
from engine.quant.groupwise import QuantizedTensor
from engine.sampling_defaults import GGUF_KEYS, from_generation_config
from engine.tokenizer import Tokenizer

# GGUF architecture -> HF architecture: Llama's tensor layout (qwen3 adds q/k norms; qwen35 adds the
# Gated DeltaNet layers and gated attention, gguf_qwen35.py); qwen3moe / qwen35moe add experts (gguf_moe.py).
# qwen3vl / qwen3vlmoe: Qwen3-VL's text model, Qwen3's layers (its tower: an mmproj file, gguf_mmproj.py)
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3vl": "Qwen3ForCausalLM",
    "qwen35": "Qwen3_5ForCausalLM",
    **gguf_moe.MOE_ARCHITECTURES,
}
HYBRID = ("qwen35", "qwen35moe", "qwen3next")  # the Qwen3.5 layout (gguf_qwen35.py)
TILED = ("qwen35", "qwen35moe")  # value heads in the converter's tiled order (Qwen3-Next's are as HF's)

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    **gguf_qwen35.LAYER_NAMES,
    **gguf_moe.LAYER_NAMES,
    **qwen3_next.GGUF_FUSED,
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    # a reranker's classifier (pooling type rank): kept apart from the decoder (engine/rerank.py)
    "cls.output.weight": "score.weight",
    "cls.output.bias": "score.bias",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_READ_INTO_CONFIG = ("rope_freqs.weight",)  # Llama 3's rotation factors (_rope_scaling)

log = logging.getLogger("ninfer")

# pre-tokenizer regexes by tokenizer.ggml.pre (the split rules the original HF tokenizers use)
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen3.5: Qwen2's, with combining marks (\p{M}) kept in the word they belong to
_QWEN35_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt2", "default"):
        return byte_level
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {
        "llama-bpe": _LLAMA3_SPLIT,
        "llama3": _LLAMA3_SPLIT,
        "qwen2": _QWEN2_SPLIT,
        "qwen35": _QWEN35_SPLIT,
    }.get(pre)
    if split is None:
        raise NinferError(
            f"this GGUF uses the pre-tokenizer '{pre}', which ninfer does not know yet; "
            "use the HF checkpoint directory of the model instead"
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


# control tokens that end a generation wherever a vocabulary has them (a GGUF names one eos; Qwen's HF
# generation_config names <|im_end|> and <|endoftext|>, and llama.cpp ends on both)
_END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>")


def _end_of_generation(reader, tokens: list[str], types: list[int]) -> tuple[int, ...]:
    """The ids besides eos that end a generation: the eot / eom keys and the known end tokens (control)."""
    keys = (_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom"))
    named = (i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3 and t in _END_TOKENS)
    return tuple(dict.fromkeys(i for i in (*keys, *named) if i is not None))


def _build_tokenizer(reader) -> Tokenizer | None:
    model = _field(reader, "tokenizer.ggml.model")
    if model is None:
        return None
    if model != "gpt2":
        raise NinferError(
            f"this GGUF has a '{model}' tokenizer; ninfer reads BPE ('gpt2') GGUF tokenizers only — "
            "use the HF checkpoint directory of the model instead"
        )
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    backend = HFTokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre", "gpt2"))
    backend.decoder = decoders.ByteLevel()
    # 3 = control, 4 = user defined (llama.cpp token types)
    backend.add_special_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    backend.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == 4])

    def tok(key: str) -> str | None:
        i = _field(reader, key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    return Tokenizer(
        backend=backend,
        chat_template=_field(reader, "tokenizer.chat_template"),
        bos_token=tok("tokenizer.ggml.bos_token_id"),
        eos_token=tok("tokenizer.ggml.eos_token_id"),
        pad_token=tok("tokenizer.ggml.padding_token_id"),
        unk_token=tok("tokenizer.ggml.unknown_token_id"),
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        extra_eos_token_ids=_end_of_generation(reader, tokens, types),
        sampling_defaults=from_generation_config(
            {name: _field(reader, key) for name, key in GGUF_KEYS.items()}
        ),
    )


def _config(reader, path: Path) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise NinferError(
            f"unsupported GGUF architecture '{arch}' in {path}; ninfer reads GGUF files of: {', '.join(ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}

    def key(name: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{name}", default)
        if value is None:
            raise NinferError(f"{path} lacks the metadata key {arch}.{name}; the file is incomplete")
        return value

    num_heads = key("attention.head_count")
    hidden = key("embedding_length")
    # Llama 3.1+: llama.cpp's converter stores the llama3 rope scaling as per-dimension frequency factors
    # (rope_freqs.weight [rotary_dim / 2]; each rotation frequency is divided by its factor)
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    scaling = _rope_scaling(reader, arch)
    if freqs is not None:
        scaling = {"rope_type": "freq_factors", "factors": [float(f) for f in np.asarray(freqs.data).ravel()]}
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    head_dim = key("attention.key_length", hidden // num_heads)
    num_layers = key("block_count")
    layout: dict[str, Any] = dict(
        architecture=ARCHITECTURES[arch],
        num_hidden_layers=num_layers,
        layer_types=("full_attention",) * num_layers,
    )
    if arch in HYBRID:
        text = gguf_qwen35.text_layers(names, num_layers)
        layout = gguf_qwen35.config_fields(key, head_dim, text, num_layers - text)
    if arch in gguf_moe.MOE_ARCHITECTURES:

        def field(name: str, default: Any) -> Any:
            return _field(reader, f"{arch}.{name}", default)

        experts = gguf_moe.config_fields(key, field, names, layout["num_hidden_layers"])
        layout = {**layout, **experts, "architecture": ARCHITECTURES[arch]}
    if "intermediate_size" not in layout:
        layout["intermediate_size"] = key("feed_forward_length")
    config = ModelConfig(
        vocab_size=key("vocab_size", len(tokens)),
        hidden_size=hidden,
        num_attention_heads=num_heads,
        num_key_value_heads=key("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=key("context_length"),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(i for i in (eos, eot) if i is not None),
        embedding_model=_pooled(reader, arch, path) is not None,
        qkv_bias=arch == "qwen2",
        **layout,
        **_rerank_fields(reader, arch, path, names),
    )
    return config.with_rope_scaling(scaling, str(path)) if scaling else config


def _pooled(reader, arch: str, path: Path) -> str | None:
    """How llama.cpp's pooling type says the model pools: "last" (Qwen3-Embedding, 3), "rank" (a reranker's
    classifier over the last token, 4), None for a text model; mean (1) and cls (2) are refused in a
    sentence."""
    kind = _field(reader, f"{arch}.pooling_type", 0)
    if kind in (0, -1):
        return None
    if kind not in (3, 4):
        name = {1: "mean", 2: "cls"}.get(kind, str(kind))
        raise NinferError(
            f"{path} is an embedding model pooled by '{name}'; ninfer pools by the last token only "
            "(Qwen3-Embedding, or a reranker's classifier)"
        )
    return "last" if kind == 3 else "rank"


def _rerank_fields(reader, arch: str, path: Path, names: set[str]) -> dict[str, Any]:
    """A rank-pooled GGUF's reranker fields (ModelConfig.rerank...): its classifier, labels and pair prompt."""
    if _pooled(reader, arch, path) != "rank":
        return {}
    if "cls.output.weight" not in names:
        raise NinferError(
            f"{path} is pooled by rank but holds no classifier (cls.output.weight); convert the reranker "
            "again with llama.cpp's convert_hf_to_gguf.py, or serve its HF checkpoint"
        )
    labels = _field(reader, f"{arch}.classifier.output_labels") or ()
    return dict(
        rerank="classifier",
        rerank_labels=tuple(str(label) for label in labels),
        rerank_template=_field(reader, "tokenizer.chat_template.rerank"),
    )


def _rope_scaling(reader, arch: str) -> dict[str, Any] | None:
    """llama.cpp's rope.scaling.* keys (a GGUF converted from a config with YaRN or linear scaling) as a
    config.json rope_scaling."""
    kind = _field(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn" and factor:
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        original = _field(reader, f"{arch}.rope.scaling.original_context_length")
        if original:
            scaling["original_max_position_embeddings"] = int(original)
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            value = _field(reader, f"{arch}.rope.scaling.{key}")
            if value:
                scaling[name] = float(value)
        return scaling
    raise NinferError(
        f"this GGUF's rope scaling is '{kind}' (factor {factor}); ninfer runs yarn and linear scaling: convert "
        "the checkpoint again, or pass --rope-scaling"
    )


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo the row interleave llama.cpp's converter applies to Llama Q/K (HF rotate-half -> GGML pairs)."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str, num_layers: int, mtp_layers: int = 0) -> str | None:
    """The HF name of GGUF tensor `name`; None for tensors ninfer does not read (llama.cpp-only tensors and
    rope_freqs, which is read into the config). Blocks past the `num_layers` text layers are the MTP
    head's (`mtp_layers` of them)."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK_RE.match(name)
    if m is None or int(m.group(1)) >= num_layers + mtp_layers:
        return None
    layer, rest = m.groups()
    prefix = f"model.layers.{layer}"
    if int(layer) >= num_layers:
        prefix = f"mtp.layers.{int(layer) - num_layers}"
    if rest in gguf_qwen35.PARAMETERS:
        return f"{prefix}.{gguf_qwen35.PARAMETERS[rest]}"
    module, _, suffix = rest.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if prefix.startswith("mtp.") and module in gguf_qwen35.NEXTN_NAMES:
        return f"mtp.{gguf_qwen35.NEXTN_NAMES[module]}.{suffix}"
    if module not in _LAYER_NAMES:
        return None
    return f"{prefix}.{_LAYER_NAMES[module]}.{suffix}"


def _open(path: Path) -> GGUFFile:
    """The file's header (its fields, and read-only maps of its tensors). A process that opens the same
    file again (the planner then the loader, a draft model, a reload) reuses the parse while the file is
    unchanged."""
    try:
        stat = Path(path).stat()
    except OSError as e:
        raise NinferError(f"{path} is not a readable GGUF file ({e}); download it again") from e
    return _parsed(str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parsed(path: str, inode: int, size: int, mtime_ns: int) -> GGUFFile:
    try:
        return GGUFFile(path)
    except (ValueError, OSError) as e:
        raise NinferError(f"{path} is not a readable GGUF file ({e}); download it again") from e


def _layout(reader, config: ModelConfig):
    """The tensors the loader reads, (tensor, HF name) each; the order each must be read back in; the
    names of those the GPU holds packed (an experts' stack: each expert's matrices); and the names of the
    file's tensors the model has no place for."""
    arch = _field(reader, "general.architecture")
    layers, mtp = config.num_hidden_layers, config.mtp_num_hidden_layers
    named, orders, unread = [], {}, []
    for t in reader.tensors:
        name = _hf_name(t.name, layers, mtp)
        if name is None:
            if t.name not in _READ_INTO_CONFIG:
                unread.append(t.name)
            continue
        fused = qwen3_next.fused_projection(name)
        if fused is None:
            named.append((t, name))
            orders[name] = _order(arch, name, config)
            continue
        # Qwen3-Next's fused projection: each part its rows of the one tensor (qwen3_next.py)
        for part, rows in zip(qwen3_next.PARTS[fused], qwen3_next.part_rows(fused, config)):
            part_name = name.replace(f".{fused}.", f".{part}.")
            named.append((t, part_name))
            orders[part_name] = (0, rows)
    blocks = any(gguf_blocks.is_block_quantized(t.tensor_type) for t, _ in named)
    packed = {name for t, name in named if _keeps_packed(t, name, orders[name], blocks)}
    return named, orders, packed, unread


def _warn_unread(unread: list[str], config: ModelConfig) -> None:
    """Say which of the file's tensors the model has no place for (a variant's extra tensor dropped
    silently would change its outputs unannounced), as the HF loader says of a checkpoint's."""
    if unread:
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        log.warning(
            "ignored %d GGUF tensor(s) this %s model has no place for: %s%s",
            len(unread),
            config.architecture,
            ", ".join(unread[:3]),
            more,
        )


def _matrices(t, name: str) -> list[tuple[str, tuple[int, int]]]:
    """(HF name, shape) of each matrix a tensor holds: itself, or each expert's of a stack."""
    shape = _shape(t)
    if not gguf_moe.is_stack(name):
        return [(name, shape)]
    return [
        (expert_name, (shape[1] // len(parts), shape[2]))
        for parts in gguf_moe.split_names(name, shape[0])
        for expert_name, _ in parts
    ]


def gpu_tensors(path: Path) -> tuple[ModelConfig, list[tuple[str, tuple[int, ...], int | None]]]:
    """The config, and each tensor the CUDA loader holds: (HF name, shape, bytes held packed or None where
    it is held dense). What `ninfer plan` counts for a GGUF."""
    reader = _open(path)
    config = _config(reader, path)
    named, orders, packed, _ = _layout(reader, config)
    tensors = []
    for t, name in named:
        for matrix, shape in _matrices(t, name):
            if orders[name] is not None and orders[name][0] == 0:  # (a fused projection's part: its rows)
                shape = (len(orders[name][1]), *shape[1:])
            held = gguf_blocks.held_nbytes(t.tensor_type, shape) if name in packed else None
            tensors.append((matrix, shape, held))
    return config, tensors


def load_gguf(path: Path) -> ModelSource:
    import gguf

    reader = _open(path)
    config = _config(reader, path)
    arch = _field(reader, "general.architecture")
    named, orders, packed, unread = _layout(reader, config)
    _warn_unread(unread, config)

    def dense(t, name: str) -> WeightIterator:
        """The tensor as the checkpoint holds it (an experts' stack: each expert's matrices)."""
        tensor = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        tensor = tensor.reshape(_shape(t))
        if arch in HYBRID:
            tensor = gguf_qwen35.restore_values(name, tensor)
        if gguf_moe.is_stack(name):
            yield from gguf_moe.per_expert(name, tensor)
            return
        tensor = gguf_moe.restore_shape(name, tensor)
        yield name, tensor if orders[name] is None else tensor.index_select(*orders[name])

    def weights() -> WeightIterator:
        for t, name in named:
            yield from dense(t, name)

    def quantized() -> Iterator[tuple[str, QuantizedTensor]]:
        for t, name in named:
            if name not in packed:
                continue
            if gguf_moe.is_stack(name):
                for expert_name, rows in gguf_moe.expert_rows(name, np.asarray(t.data), _shape(t)[0]):
                    shape = (rows.shape[0], _shape(t)[2])
                    yield expert_name, gguf_blocks.to_groupwise(rows, t.tensor_type, shape)
                continue
            qt = gguf_blocks.to_groupwise(np.asarray(t.data), t.tensor_type, _shape(t))
            yield name, qt if orders[name] is None else gguf_blocks.select(qt, *orders[name])

    def unquantized() -> WeightIterator:
        for t, name in named:
            if name not in packed:
                yield from dense(t, name)

    # bits of each block-quantized tensor, for the CPU's int4 / int8 copies (weight_quant=auto)
    tensor_bits = {
        matrix: gguf_blocks.source_bits(t.tensor_type)
        for t, name in named
        if gguf_blocks.is_block_quantized(t.tensor_type)
        for matrix, _ in _matrices(t, name)
    }
    return ModelSource(
        config,
        _build_tokenizer(reader),
        weights,
        f"{path} (GGUF {config.architecture})",
        tensor_bits,
        quantized_weights=quantized if packed else None,
        unquantized_weights=unquantized if packed else None,
    )


def _shape(t) -> tuple[int, ...]:
    """A GGUF tensor's shape in torch order ([N, K] for a matrix; GGUF lists the fastest dimension first)."""
    return tuple(int(d) for d in reversed(t.shape))


def _order(arch: str, name: str, config: ModelConfig) -> tuple[int, torch.Tensor] | None:
    """(dim, index): the checkpoint's tensor is the converter's `index_select(dim, index)`; None if unmoved."""
    if arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
        heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
        rows = torch.arange(heads * config.head_dim)
        return 0, _unpermute(rows.unsqueeze(1), heads).squeeze(1)
    if arch in TILED:
        return gguf_qwen35.value_head_order(name, config)
    return None


def _keeps_packed(t, name: str, order: tuple[int, torch.Tensor] | None, blocks: bool) -> bool:
    """A block-quantized matrix goes to the GPU packed (gguf_blocks.py), and so does a float one in a file
    of block-quantized matrices (a fused projection packs only whole), unless its columns must move in runs
    its groups cut through. The conv1d kernel, a reranker's classifier and every vector stay dense."""
    shape = _shape(t)
    if gguf_moe.is_stack(name):  # each expert's matrix, as the stacked experts kernel takes it
        shape = shape[1:]
    if len(shape) != 2 or name.startswith("score.") or not gguf_blocks.kernel_takes(t.tensor_type, shape):
        return False
    if not gguf_blocks.is_block_quantized(t.tensor_type):
        router = name.endswith((".mlp.gate.weight", ".shared_expert_gate.weight"))  # kept as stored
        linear = blocks and name.endswith(".weight") and "conv1d" not in name and not router
        if not (linear and gguf_blocks.packable_float(t.tensor_type)):
            return False
    _, group = gguf_blocks.target(t.tensor_type)
    return order is None or order[0] == 0 or gguf_blocks.moves_whole_groups(order[1], group)
