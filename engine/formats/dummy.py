"""Random weights at a real model's shapes: `dummy:SHAPE[:RECIPE]` as the MODEL argument.

For timing without a checkpoint (vLLM's `--load-format dummy`): SHAPE is a preset of `ninfer plan`
(qwen3.5-27b, qwen3-8b, ...), an HF checkpoint directory or a config.json; RECIPE is how the matrices are
held, w4g128 (default), w4g32, w6g128, w8g128, w8g32, bf16, or nvfp4 / mxfp4 (as an FP4 checkpoint stores
them: engine/formats/hf_fp4.py). The weights are random (codes uniform, scales
for a standard deviation of 1/sqrt(columns), vectors 0.02, norm weights one), so the text is noise and
speed is all it tells: the same bytes stream through the same kernels as a converted checkpoint of that
shape and recipe; the dense path (the CPU) gets the same matrices dequantized.

The tensors are named as a checkpoint names them, derived from the model built on the meta device (fused
projections split back into their shards, stacked experts into experts), and each name is checked to load
back into the parameter it came from. One random tensor serves every matrix of a shape (the loader copies
each into its own storage), so making a 27B model's weights takes seconds. The tokenizer reads text as
bytes (one token a byte, ChatML template); the rest of the vocabulary decodes as `<tN>`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, pre_tokenizers
from tokenizers.models import BPE

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.hf_fp4 import Fp4Tensor
from engine.formats.source import ModelSource, WeightIterator
from engine.quant.groupwise import QuantizedTensor, dequantize, fitting_group
from engine.quant.recipes import is_quantizable
from engine.tokenizer import Tokenizer

PREFIX = "dummy:"
RECIPES = ("w4g128", "w4g32", "w6g128", "w8g128", "w8g32", "bf16", "nvfp4", "mxfp4")
# an NVFP4 / MXFP4 checkpoint's matrices: e2m1 codes, a scale byte a group (held as stored on a GPU)
FP4_GROUPS = {"nvfp4": 16, "mxfp4": 32}
_E2M1_STD = (68.5 / 8) ** 0.5  # uniform codes: the root mean square of 0, 0.5, 1, 1.5, 2, 3, 4, 6
# what FP4 checkpoints keep 16-bit (named as engine/plan/weights.tensor_kind tells them)
_FP4_DENSE = ("embed_tokens", "lm_head")
DEFAULT_RECIPE = "w4g128"
VECTOR_STD = 0.02  # biases, gates, convolution and decay parameters; a matrix's is 1/sqrt(its columns)
# a code's standard deviation for uniform codes: 4-bit 0..15, 6-bit 0..63, 8-bit -127..127
_CODE_STD = {4: (256 / 12) ** 0.5, 6: (4096 / 12) ** 0.5, 8: (255**2 / 12) ** 0.5}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is string else '' }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_RECIPE = re.compile(r"^w([468])g(\d+)$")


def is_dummy(model: str | Path | None) -> bool:
    return isinstance(model, str) and model.startswith(PREFIX)


def parse(spec: str) -> tuple[str, str]:
    """`dummy:SHAPE[:RECIPE]` -> (SHAPE, RECIPE)."""
    body = spec[len(PREFIX) :]
    shape, sep, recipe = body.rpartition(":")
    if not sep or "/" in recipe or Path(body).expanduser().exists():  # no recipe named
        shape, recipe = body, DEFAULT_RECIPE
    if recipe not in RECIPES:
        raise NinferError(f"dummy weights take the recipes {', '.join(RECIPES)}, not '{recipe}'")
    if not shape:
        raise NinferError(
            f"'{spec}' names no shape; write dummy:PRESET[:RECIPE] (e.g. dummy:qwen3-8b:w4g128) or "
            "dummy:/path/to/config.json"
        )
    return shape, recipe


def _config(shape: str) -> ModelConfig:
    from engine.plan.presets import PRESETS, preset

    path = Path(shape).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file() and path.suffix == ".json":
        try:
            return ModelConfig.from_hf_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise NinferError(f"{path} is not an HF config.json ({e})") from e
    if shape.lower() in PRESETS and shape.lower() != "default":
        return preset(shape).config
    return _not_a_shape(shape)


def _not_a_shape(shape: str):
    from engine.plan.presets import PRESETS

    known = ", ".join(p for p in PRESETS if p != "default")
    raise NinferError(
        f"dummy weights need a shape: '{shape}' is neither a preset ({known}) nor an HF directory or "
        f"config.json; recipes: {', '.join(RECIPES)} (e.g. dummy:qwen3-8b:w4g128)"
    )


def load_dummy(spec: str) -> ModelSource:
    """A ModelSource of random weights for `dummy:SHAPE[:RECIPE]` (see the module docstring)."""
    shape, recipe = parse(spec)
    config = _config(shape)
    tensors = checkpoint_tensors(config)
    if recipe in FP4_GROUPS:
        return _fp4_source(config, shape, recipe, tensors)
    match = _RECIPE.match(recipe)
    bits, group = (int(match[1]), int(match[2])) if match else (None, None)
    quantized = {n: s for n, s in tensors if bits and len(s) == 2 and is_quantizable(n, s)}
    dense = [(n, s) for n, s in tensors if n not in quantized]
    dtype = torch.bfloat16 if bits is None else torch.float32

    def unquantized() -> WeightIterator:
        made: dict = {}  # one random tensor a kind and shape, for this pass only
        for name, s in dense:
            yield name, _dense(made, name, s, dtype)

    def quantized_weights() -> Iterator[tuple[str, QuantizedTensor]]:
        made: dict = {}
        for name, s in quantized.items():
            if s not in made:
                made[s] = _random_quantized(s, bits, group)
            yield name, made[s]

    def weights() -> WeightIterator:  # the dense path: the same matrices, dequantized (once a shape)
        yield from unquantized()
        made: dict = {}
        for name, qt in quantized_weights():
            if id(qt) not in made:
                made[id(qt)] = dequantize(qt)
            yield name, made[id(qt)]

    return ModelSource(
        config,
        byte_tokenizer(config.vocab_size),
        weights,
        f"random weights at {shape}'s shapes ({recipe}, {config.architecture})",
        {name: bits for name in quantized},
        quantized_weights=quantized_weights if quantized else None,
        unquantized_weights=unquantized if quantized else None,
    )


def _fp4_source(
    config: ModelConfig, shape: str, recipe: str, tensors: list[tuple[str, tuple[int, ...]]]
) -> ModelSource:
    """dummy:SHAPE:nvfp4 / mxfp4: the quantizable matrices as an FP4 checkpoint's (native_weights: held as
    stored where the fused kernels run), streamed dequantized elsewhere, as engine/formats/hf_dir.py does."""
    group = FP4_GROUPS[recipe]
    fp4, dense = fp4_split(tensors)

    def unquantized() -> WeightIterator:
        made: dict = {}
        for name, s in dense:
            yield name, _dense(made, name, s, torch.bfloat16)

    def quantized() -> Iterator[tuple[str, Fp4Tensor]]:
        made: dict = {}
        for name, s in fp4.items():
            if s not in made:
                made[s] = _random_fp4(s, group)
            yield name, made[s]

    def weights() -> WeightIterator:
        yield from unquantized()
        made: dict = {}
        for name, t in quantized():
            if id(t) not in made:
                made[id(t)] = t.dequantized()
            yield name, made[id(t)]

    description = f"random weights at {shape}'s shapes ({recipe}, {config.architecture})"
    tokenizer = byte_tokenizer(config.vocab_size)
    return ModelSource(
        config, tokenizer, weights, description, stored_bits=4, native_weights=(quantized, unquantized)
    )


def fp4_split(
    tensors: list[tuple[str, tuple[int, ...]]],
) -> tuple[dict[str, tuple[int, int]], list[tuple[str, tuple[int, ...]]]]:
    """(the matrices an FP4 dummy stores as FP4, the rest): the quantizable ones but the embedding table and
    the head, which FP4 checkpoints keep 16-bit (llm-compressor's and Model Optimizer's defaults)."""
    fp4 = {
        n: s
        for n, s in tensors
        if len(s) == 2 and s[1] % 2 == 0 and is_quantizable(n, s) and not any(d in n for d in _FP4_DENSE)
    }
    return fp4, [(n, s) for n, s in tensors if n not in fp4]


def checkpoint_tensors(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(checkpoint name, shape) of every tensor the model built from `config` loads (the MTP head's too
    where the config declares one; not a vision tower), each checked to map back to its parameter."""
    from engine.layers.linear import MergedLinear
    from engine.models.registry import model_class

    with torch.device("meta"):
        model = model_class(config)(config)
        if config.mtp_num_hidden_layers:
            model.build_mtp()
    owners = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    inverse = {fused_shard: part for part, fused_shard in model.packed_modules_mapping.items()}
    renamed = {new: old for old, new in model.renamed_params.items()}
    out = []
    for pname, param in model.named_parameters():  # (a tied head once, under the embedding's name)
        for shard in param.shard_names or (None,):
            name, shape = pname, tuple(param.shape)
            if shard is not None and ":" in shard:  # one expert of stacked experts: gate:e, up:e, down:e
                kind, index = shard.split(":")
                name = f"{pname.rsplit('.', 1)[0]}.{index}.{kind}_proj.weight"
                rows = shape[1] // 2 if kind != "down" else shape[1]
                shape = (rows, shape[2])
            elif shard is not None:  # a fused projection's shard: its checkpoint projection
                fused = pname.split(".")[-2]
                name = pname.replace(f".{fused}.", f".{inverse[fused, shard]}.")
                owner = owners[id(param)]
                assert isinstance(owner, MergedLinear)
                shape = (owner.offsets[shard][1], *shape[1:])
            for new, old in renamed.items():
                if name.endswith(new):
                    name = name[: -len(new)] + old
            if model.param_for(name) != (pname, shard):
                raise NinferError(
                    f"dummy weights cannot name {pname} [{shard}] of a {config.architecture} model as a "
                    f"checkpoint would (got {name}); use a real checkpoint"
                )
            out.append((name, shape))
    return out


def _random_quantized(shape: tuple[int, int], bits: int, group: int) -> QuantizedTensor:
    """Uniform random codes, scales for a weight standard deviation of 1/sqrt(K), minimums centring the
    codes on zero (one per shape: the loader copies it into each matrix's storage)."""
    n, k = shape
    group = fitting_group(k, group)
    kp = -(-k // group) * group
    gen = torch.Generator().manual_seed(n * 131 + k)
    if bits == 8:
        packed = torch.randint(-127, 128, (n, kp), generator=gen, dtype=torch.int8)
    else:
        packed = torch.randint(0, 256, (n, kp * bits // 8), generator=gen, dtype=torch.uint8)
    scale = k**-0.5 / _CODE_STD[bits]  # (activations keep their size through the layers)
    scales = torch.full((n, kp // group), scale, dtype=torch.float16)
    minimums = None if bits == 8 else torch.full_like(scales, -scale * (2**bits - 1) / 2)
    return QuantizedTensor(bits, group, (n, k), packed, scales, minimums)


def _random_fp4(shape: tuple[int, int], group: int) -> Fp4Tensor:
    """Uniform random e2m1 codes for a weight standard deviation of 1/sqrt(K): NVFP4, every group's scale
    e4m3 1.0 (0x38) and the tensor scale that; MXFP4 (no tensor scale), every group's exponent the power
    of two nearest it."""
    n, k = shape
    gen = torch.Generator().manual_seed(n * 131 + k)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    target = k**-0.5 / _E2M1_STD
    groups = -(-k // group)
    if group == FP4_GROUPS["mxfp4"]:
        exponent = round(math.log2(target))
        scales = torch.full((n, groups), 127 + exponent, dtype=torch.uint8)
        return Fp4Tensor(packed, scales, torch.ones(n), group, True, (n, k))
    scales = torch.full((n, groups), 0x38, dtype=torch.uint8)  # e4m3 1.0
    return Fp4Tensor(packed, scales, torch.full((n,), target), group, False, (n, k))


def _dense(made: dict, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Norm weights one, matrices normal with a standard deviation of 1/sqrt(columns), other tensors with
    VECTOR_STD; one tensor a kind and shape in `made`."""
    norm = len(shape) == 1 and "norm" in name
    if (norm, shape) not in made:
        gen = torch.Generator().manual_seed(sum(shape))
        std = shape[-1] ** -0.5 if len(shape) >= 2 else VECTOR_STD
        values = torch.ones(shape) if norm else torch.randn(shape, generator=gen) * std
        made[norm, shape] = values.to(dtype)
    return made[norm, shape]


def byte_tokenizer(vocab_size: int) -> Tokenizer:
    """Text as bytes (byte-level, no merges), ChatML's special tokens last, every id between them and the
    model's vocabulary size decoding as `<tN>`."""
    base = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 characters bytes read as
    if vocab_size < len(base) + len(SPECIAL_TOKENS):
        raise NinferError(
            f"a vocabulary of {vocab_size} tokens is too small for dummy weights' byte tokenizer"
        )
    vocab = {c: i for i, c in enumerate(base)}
    vocab.update({f"<t{i}>": i for i in range(len(base), vocab_size - len(SPECIAL_TOKENS))})
    backend = HFTokenizer(BPE(vocab=vocab, merges=[], fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return Tokenizer(backend=backend, chat_template=CHATML, eos_token="<|im_end|>", pad_token="<|endoftext|>")
