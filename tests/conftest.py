"""Shared fixtures: seeds, tiny random-initialised HF models saved as checkpoints, tolerances."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import pytest
import torch


def _import_the_project() -> None:
    """`python -m pytest` puts the checkout first on sys.path, where kernels/ would shadow Hugging Face's
    `kernels` library that transformers imports: the checkout leaves the path (the project is installed; its
    folders install as engine, ninfer_cli and ninfer_kernels). And pytest puts tests/ there, where
    tests/engine/ would read as a namespace package `engine`, found ahead of the installed one (an editable
    install's finder is asked after the path): the project's packages are imported once with tests/ off the
    path, so every later import gets them from sys.modules."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here.parent]
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if Path(p or ".").resolve() != here]
    try:
        import engine  # noqa: F401
        import ninfer_cli  # noqa: F401
    finally:
        sys.path[:] = saved


_import_the_project()

import ninfer_kernels as kernels  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not torch.cuda.is_available():
    # Triton kernels run on CPU tensors through the interpreter; set before any kernel module imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_patching  # noqa: E402

    interpreter_patching.install()

# shapes small enough for CPU, big enough to exercise GQA, partial rotary and the hybrid layout
TINY_COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    # wide enough init that continuations are varied (a tied tiny model otherwise repeats its input)
    initializer_range=0.2,
)


# structured outputs: a schema whose every value is bounded, so even a random model's reply ends
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Berlin"]},
        "capital": {"type": "boolean"},
        "rank": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["city", "capital", "rank"],
    "additionalProperties": False,
}


def follows_city_schema(text: str) -> bool:
    """`text` is JSON that CITY_SCHEMA allows (raises on text that is not JSON)."""
    import json

    value = json.loads(text)
    return (
        set(value) == {"city", "capital", "rank"}
        and value["city"] in ("Paris", "Rome", "Berlin")
        and isinstance(value["capital"], bool)
        and isinstance(value["rank"], int)
        and 0 <= value["rank"] <= 99
    )


def byte_tokenizer():
    """ninfer's Tokenizer over a byte-level BPE without merges (one token a byte, then <|im_end|>): a real
    tokenizer for tiny models where the embedded model is not installed (a GPU lease)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.pre_tokenizers import ByteLevel

    from engine.tokenizer import Tokenizer

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    return Tokenizer(backend=backend, eos_token="<|im_end|>")


def rope_model_config(**fields):
    """A one-layer ModelConfig with 128-wide heads, for rotary-frequency tests (fields override)."""
    from engine.config import ModelConfig

    base = dict(
        architecture="LlamaForCausalLM",
        vocab_size=32,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=131072,
    )
    return ModelConfig(**{**base, **fields})


def write_config_gguf(path: Path, arch: str, context: int, rope_theta: float, keys=None, tensors=None):
    """A one-layer GGUF of `arch` with 128-wide heads (as rope_model_config) and only an output matrix:
    enough for its config to be read. `keys`: more metadata, typed by value (str, int as uint32, float as
    float32); `tensors`: more tensors. Returns a reader over it."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    shape = {"block_count": 1, "context_length": context, "embedding_length": 256, "feed_forward_length": 512}
    heads = {"attention.head_count": 2, "attention.head_count_kv": 1, "vocab_size": 32}
    for key, value in {**shape, **heads}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{arch}.rope.freq_base", rope_theta)
    for key, value in (keys or {}).items():
        add = {str: writer.add_string, int: writer.add_uint32, float: writer.add_float32}[type(value)]
        add(key, value)
    for name, t in {**(tensors or {}), "output.weight": np.zeros((32, 256), dtype=np.float32)}.items():
        writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(str(path))


def tiny_hf_model(arch: str, tied: bool, seed: int = 0, **overrides):
    """A random-initialised transformers model of `arch` (llama, qwen2, qwen3, qwen3_moe, qwen3_5,
    qwen3_5_moe, qwen3_next)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = {**TINY_COMMON, **overrides}
    if arch == "llama":
        cfg = tf.LlamaConfig(num_hidden_layers=2, rope_theta=10000.0, tie_word_embeddings=tied, **common)
        model = tf.LlamaForCausalLM(cfg)
    elif arch == "qwen2":  # Llama with biased q / k / v projections (Qwen2.5, Qwen2.5-Coder)
        cfg = tf.Qwen2Config(num_hidden_layers=2, rope_theta=1e6, tie_word_embeddings=tied, **common)
        model = tf.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(num_hidden_layers=2, rope_theta=1e6, tie_word_embeddings=tied, **common)
        model = tf.Qwen3ForCausalLM(cfg)
    elif arch == "qwen3_moe":  # 3 layers: sparse, dense (mlp_only_layers), sparse; 8 experts, 2 a token
        moe = dict(
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            rope_theta=1e6,
        )
        cfg = tf.Qwen3MoeConfig(tie_word_embeddings=tied, **{**moe, **common})
        model = tf.Qwen3MoeForCausalLM(cfg)
    elif arch in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        hybrid = dict(
            num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        )
        # every layer a mixture of 8 experts (2 a token) and a shared expert
        moe = dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        )
        if arch == "qwen3_5":
            cfg = tf.Qwen3_5TextConfig(tie_word_embeddings=tied, **{**hybrid, **common})
            model = tf.Qwen3_5ForCausalLM(cfg)
        elif arch == "qwen3_5_moe":
            cfg = tf.Qwen3_5MoeTextConfig(tie_word_embeddings=tied, **{**hybrid, **moe, **common})
            model = tf.Qwen3_5MoeForCausalLM(cfg)
        else:  # Qwen3-Next: Qwen3.5-MoE's layers with fused, per-group interleaved linear projections;
            # layer 1 dense (mlp_only_layers)
            extra = dict(mlp_only_layers=[1])
            cfg = tf.Qwen3NextConfig(tie_word_embeddings=tied, **{**hybrid, **moe, **extra, **common})
            model = tf.Qwen3NextForCausalLM(cfg)
    else:
        raise ValueError(arch)
    # random norms and biases too, so that a norm applied the wrong way shows up
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            if name.endswith("proj.bias"):  # (zero at init: a bias loaded wrongly would not show)
                p.copy_(torch.randn_like(p) * 0.5)
    return model.eval()


# a tiny Qwen3.5 vision tower: 8-pixel patches merged 2 x 2, a 4 x 4 learned position grid
TINY_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    patch_size=8,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=16,
    initializer_range=0.2,  # wide enough that a picture moves the logits as much as the text does
)
# images from 32 x 32 up to 64 x 64 pixels after resizing: 4 to 16 tokens each
TINY_PREPROCESSOR = {
    "size": {"shortest_edge": 32 * 32, "longest_edge": 64 * 64},
    "image_mean": [0.48, 0.46, 0.41],
    "image_std": [0.27, 0.26, 0.28],
    "patch_size": 8,
    "merge_size": 2,
    "temporal_patch_size": 2,
}


def tiny_vl_model(
    seed: int = 0, vocab_size: int = 512, image_token_id: int = 500, arch: str = "qwen3_5", **overrides
):
    """A random-initialised transformers multimodal model with TINY_VISION; placeholder ids image_token_id
    and the three after it (video, vision start, vision end). arch qwen3_5: Qwen3_5ForConditionalGeneration,
    the tiny hybrid text model with M-RoPE (rotary 8 of 16 dims: sections 2, 1, 1 interleaved); qwen3_vl:
    Qwen3VLForConditionalGeneration, a 3-layer Qwen3 (rotary 16 dims: sections 4, 2, 2 interleaved) and
    deepstack levels from vision blocks 0 and 1; qwen3_vl_moe: Qwen3VLMoeForConditionalGeneration, that
    model with layers 0 and 2 mixtures of 8 experts (2 a token), layer 1 dense (mlp_only_layers)."""
    import transformers as tf

    torch.manual_seed(seed)
    vision = {**TINY_VISION, "out_hidden_size": TINY_COMMON["hidden_size"]}
    if arch == "qwen3_5":
        text = tiny_hf_model("qwen3_5", tied=False, seed=seed, vocab_size=vocab_size).config.to_dict()
        rope = {"partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]}
        wrapper, model_class = tf.Qwen3_5Config, tf.Qwen3_5ForConditionalGeneration
    else:
        text = {**TINY_COMMON, "num_hidden_layers": 3, "vocab_size": vocab_size}
        rope = {"mrope_section": [4, 2, 2]}
        vision["deepstack_visual_indexes"] = [0, 1]
        wrapper, model_class = tf.Qwen3VLConfig, tf.Qwen3VLForConditionalGeneration
        if arch == "qwen3_vl_moe":
            moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[1])
            text = {**text, **moe, "tie_word_embeddings": False}
            wrapper, model_class = tf.Qwen3VLMoeConfig, tf.Qwen3VLMoeForConditionalGeneration
    text.update(overrides)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_interleaved": True, **rope}
    cfg = wrapper(
        text_config=text,
        vision_config=vision,
        image_token_id=image_token_id,
        video_token_id=image_token_id + 1,
        vision_start_token_id=image_token_id + 2,
        vision_end_token_id=image_token_id + 3,
    )
    torch.manual_seed(seed)
    model = model_class(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def save_tiny_vl(model, path: Path) -> Path:
    import json

    save_tiny(model, path)
    (path / "preprocessor_config.json").write_text(json.dumps(TINY_PREPROCESSOR))
    return path


# Qwen3.6's rule for an assistant turn, in a small ChatML template: its reasoning is written when the
# template is told to keep every turn's, or when the turn comes after the last user message
PRESERVING_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if (preserve_thinking is defined and preserve_thinking is true) or loop.index0 > ns.last_query -%}"
    "{{ '<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{{ m.content + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif -%}"
)
# a Qwen3.5-style chat template: an image part renders as the placeholder between the vision tokens
VL_TEMPLATE = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}{% else %}{% for part in message.content %}"
    "{% if part.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part.text }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
VL_SPECIAL = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]


def save_tiny_vl_chat(path: Path, tokenizer) -> Path:
    """The tiny VL model with `tokenizer` (ninfer's, from the embedded GGUF) plus the vision tokens, and
    VL_TEMPLATE: a directory the server and `ninfer chat` take messages with images for."""
    import json

    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer.backend.to_str())
    tok.add_special_tokens(VL_SPECIAL)
    image_id = tok.token_to_id("<|image_pad|>")
    assert [tok.token_to_id(t) for t in VL_SPECIAL] == list(range(image_id, image_id + 4))
    save_tiny_vl(tiny_vl_model(vocab_size=tok.get_vocab_size(), image_token_id=image_id), path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": VL_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None})
    )
    return path


def mtp_head_tensors(model, seed: int = 5) -> dict[str, torch.Tensor]:
    """Random mtp.* tensors of a tiny transformers Qwen3.5 or Qwen3-Next (transformers builds no MTP head:
    its decoder layer gives the block's shapes), named as such a checkpoint stores them."""
    import transformers as tf

    cfg = model.config
    torch.manual_seed(seed)
    moe = getattr(cfg, "num_experts", 0)  # Qwen3.5-MoE: the head's layer is a mixture of experts too
    if cfg.model_type == "qwen3_next":
        decoder_layer = tf.models.qwen3_next.modeling_qwen3_next.Qwen3NextDecoderLayer
    elif moe:
        decoder_layer = tf.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeDecoderLayer
    else:
        decoder_layer = tf.models.qwen3_5.modeling_qwen3_5.Qwen3_5DecoderLayer
    layer = decoder_layer(cfg, cfg.layer_types.index("full_attention"))
    h = cfg.hidden_size
    tensors = {
        f"mtp.layers.0.{n}": torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.1)
        for n, p in layer.state_dict().items()
    }
    tensors["mtp.fc.weight"] = torch.randn(h, 2 * h) * 0.2
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{n}.weight"] = torch.randn(h) * 0.1
    return tensors


def save_mtp_head(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Add an MTP head to a saved checkpoint: a second shard, and mtp_num_hidden_layers in config.json."""
    import json

    from safetensors.torch import save_file

    save_file(tensors, str(path / "mtp.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
    return path


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the vocabulary at each position of `ids` [len(ids), V] (fp32)."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def hf_greedy_reference(model, ids: list[int], num_tokens: int):
    """transformers' greedy continuation of `ids` and the log-softmax of each step's logits (fp32)."""
    # NOTE: no EOS in the reference's generation config, so it runs every step without suppressing a token
    model.generation_config.eos_token_id = None
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=num_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    return tokens, [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]


def write_lora_adapter(
    path: Path, shapes: dict[str, tuple[int, int]], num_layers: int, scale: float, seed: int = 0, r: int = 8
) -> Path:
    """A LoRA adapter in peft's layout (adapter_config.json, adapter_model.safetensors) without peft: for each
    layer, each module's ("self_attn.q_proj": (in, out)) random A and B, B times `scale` (0: a no-op)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(num_layers):
        for module, (n_in, n_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, n_in, generator=gen) / n_in**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, r, generator=gen) * scale
    path.mkdir()
    save_file(tensors, path / "adapter_model.safetensors")
    targets = sorted({m.rsplit(".", 1)[-1] for m in shapes})
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": targets, "bias": "none"}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def save_tiny(model, path: Path, max_shard_size: str | None = None) -> Path:
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return path


def random_prompt(n: int, seed: int) -> list[int]:
    """n token ids of a tiny model's vocabulary, fixed by `seed`."""
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def same_output(a, b, tol: float = 1e-4) -> bool:
    """The same tokens with log-probabilities within `tol` (outputs asked with logprobs=0): a cached or
    copied prefix gives what computing it gave."""
    lp = [abs(x[t] - y[t]) for x, y, t in zip(a.logprobs, b.logprobs, a.token_ids)]
    return a.token_ids == b.token_ids and max(lp) < tol


def hold_weights(model, held: dict[str, torch.Tensor]) -> None:
    """A transformers model's matrices set to `held`, named as a checkpoint names them (each expert's matrix
    a slice of transformers' stacked experts: gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
    import re

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, w in held.items():
            expert = re.match(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", name)
            if expert is None:
                params[name].copy_(w)
                continue
            base, e, kind = expert.groups()
            stack = params[f"{base}.{'down_proj' if kind == 'down' else 'gate_up_proj'}"][int(e)]
            rows = w.shape[0]
            (stack if kind == "down" else stack[:rows] if kind == "gate" else stack[rows:]).copy_(w)


def save_tiny_with_tokenizer(path: Path, tokenizer, seed: int = 5) -> Path:
    """A tiny Qwen3 of `tokenizer`'s vocabulary saved with its tokenizer.json: prompts and outputs as text."""
    model = tiny_hf_model("qwen3", tied=False, seed=seed, vocab_size=tokenizer.vocab_size)
    save_tiny(model, path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    return path


def run_serve(*args: str):
    """`ninfer serve ARGS` as a subprocess that is expected to refuse its flags before loading anything."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "ninfer_cli.main", "serve", *args], capture_output=True, text=True, timeout=60
    )


def eager_replays(graphs):
    """CUDA graphs (DecodeGraphs, a drafter's ChainGraphs) whose replays run the staged buffers eagerly (the
    path a graph records: static buffers, padding rows, outputs reused across replays), counted."""

    def replay(n, key=1, **options):
        graphs.replays += 1
        return graphs.run_eager(n, key, **options)

    graphs.replays = 0
    graphs.replay = replay
    return graphs


@pytest.fixture
def kernel_backend(monkeypatch):
    """kernels.force_backend for one test; the start-up backend comes back after it."""
    monkeypatch.setattr(kernels, "_forced", kernels._forced)
    return kernels.force_backend


@pytest.fixture
def seed():
    torch.manual_seed(0)
    return 0


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA; without it they are skipped, saying why."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_tokenizer():
    """ninfer's tokenizer of the embedded default model (built from the GGUF metadata)."""
    from engine.models.loader import default_model_path, open_source

    return open_source(default_model_path()).tokenizer


@pytest.fixture(scope="session")
def hf_default_tokenizer():
    """transformers' tokenizer of the same GGUF file: the reference."""
    from transformers import AutoTokenizer

    from engine.models.loader import default_model_path

    path = default_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="session")
def thinking_tokenizer(default_tokenizer):
    """The default tokenizer with Qwen's <think> / </think> as tokens of their own (not special, as in Qwen's
    tokenizer: decoded text keeps them, so the reasoning parser sees them)."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from engine.tokenizer import Tokenizer

    backend = HFTokenizer.from_str(default_tokenizer.backend.to_str())
    backend.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    return Tokenizer(backend=backend, eos_token=default_tokenizer.eos_token)


FIM_SPECIALS = (
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)


@pytest.fixture(scope="session")
def fim_tokenizer(default_tokenizer):
    """The default tokenizer with Qwen's fill-in-the-middle and repository tokens, not special (as in Qwen's
    tokenizer: decoded text keeps them)."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from engine.tokenizer import Tokenizer

    backend = HFTokenizer.from_str(default_tokenizer.backend.to_str())
    backend.add_tokens([AddedToken(t, special=False) for t in FIM_SPECIALS])
    return Tokenizer(backend=backend, eos_token=default_tokenizer.eos_token)


def save_thinking_mtp_model(path: Path, tokenizer, think: bool) -> Path:
    """A tiny random Qwen3.5 with an MTP head, over `tokenizer`; its template opens <think> if `think`."""
    import json

    model = tiny_hf_model("qwen3_5", tied=False, vocab_size=tokenizer.vocab_size)
    save_tiny(model, path)
    save_mtp_head(path, mtp_head_tensors(model))
    tokenizer.backend.save(str(path / "tokenizer.json"))
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n" + ("<think>\n" if think else "")
    )
    (path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": tokenizer.eos_token})
    )
    return path


@pytest.fixture(autouse=True, scope="module")
def release_fastapi_caches():
    """FastAPI memoizes each endpoint's kind in module-level lru_caches keyed by the endpoint function
    itself, which keeps every test app's route closures alive, and through them its engine (weights and KV
    pool), for the whole session: about 1 GB a test module with a server. Cleared after each module (pure
    memoization: a later call fills them again)."""
    yield
    models = sys.modules.get("fastapi.dependencies.models")
    if models is None:
        return
    for value in vars(models).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()
    gc.collect()


def streamed_tool_calls(chunks) -> list:
    """A streamed chat completion's tool calls put together by index, as clients do: the first delta of a
    call (id, type, name) with its `function.arguments` pieces joined (a custom tool's call comes whole)."""
    calls: dict[int, object] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.index not in calls:
                calls[delta.index] = delta.model_copy(deep=True)
            elif delta.function is not None and delta.function.arguments:
                calls[delta.index].function.arguments += delta.function.arguments
    return [calls[i] for i in sorted(calls)]
