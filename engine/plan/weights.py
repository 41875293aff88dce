"""Weight bytes per tensor kind, as the engine holds them on the GPU: from a recipe over the model's shapes,
or exactly from a `.ninfer` artifact or a GGUF file (its block-quantized matrices held packed,
engine/formats/gguf_blocks.py).

Rules (what the CUDA loader does, engine/models/loader.py):
* 4-, 6- and 8-bit matrices stay packed (codes + fp16 scales / minimums) for the fused dequant matmul,
  the embedding table too (rows dequantized on lookup; a tied head shares it), unless their group is
  narrower than the kernel takes (kernels/quant_matmul MIN_GROUP); vectors (norms, biases, gates) are in
  the model dtype;
* a recipe estimate of q4.6 counts every matrix at 4.6 bits (its mix is chosen per checkpoint by
  measurement, so only the artifact knows it exactly).
The MTP head and the vision tower are counted from the config (engine/plan/shapes.py); the vision tower
stays in the model dtype.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.hf_fp4 import Fp4Scheme, fp4_layers
from engine.formats.hf_intq import PARTS, ROW_GROUP, IntScheme
from engine.layers.moe import expert_shard, stack_stays_packed
from engine.plan.shapes import model_tensors, mtp_tensors, vision_tensors
from engine.quant.groupwise import fitting_group, stored_nbytes
from engine.quant.layer import fused_kernel_takes
from engine.quant.recipes import GROUP_SIZE, Q46_TARGET_BITS, RECIPES, is_quantizable, is_tower

KINDS = (
    "embedding",
    "lm_head",
    "attention",
    "linear attention",
    "mlp",
    "experts",
    "vectors",
    "mtp head",
    "vision tower",
)


def tensor_kind(name: str, shape: tuple[int, ...]) -> str:
    if len(shape) < 2:
        return "vectors"
    if "embed_tokens" in name:
        return "embedding"
    if "lm_head" in name:
        return "lm_head"
    if ".linear_attn." in name:
        return "linear attention"
    if ".self_attn." in name:
        return "attention"
    if ".mlp.experts." in name:  # a mixture of experts' stacks, or one expert's matrix
        return "experts"
    if ".mlp." in name:
        return "mlp"
    return "vectors"


def is_expert_stack(name: str, shape: tuple[int, ...]) -> bool:
    """A mixture of experts' stacked matrices [E, N, K] (gate_up_proj, down_proj)."""
    return len(shape) == 3 and ".experts." in name


def recipe_tensor_bytes(
    name: str, shape: tuple[int, ...], recipe: str, dtype_bytes: int, bits: float | None = None
) -> int:
    """Bytes of one tensor on the GPU under `recipe` (bits: an average bits/weight for every matrix instead).
    A mixture of experts' stack [E, N, K] counts as E matrices [N, K] (convert quantizes each expert's)."""
    if is_expert_stack(name, shape):
        return shape[0] * recipe_tensor_bytes(name + ".weight", shape[1:], recipe, dtype_bytes, bits)
    numel = math.prod(shape)
    dense = numel * dtype_bytes
    if not is_quantizable(name, shape):
        return dense
    if bits is not None:
        return round(numel * bits / 8)
    if recipe == "bf16":
        return dense
    if recipe == "q4.6":
        return round(numel * Q46_TARGET_BITS / 8)
    width = int(recipe[1])
    return stored_nbytes((shape[0], shape[1]), width, GROUP_SIZE)


def recipe_weight_bytes(
    config: ModelConfig,
    recipe: str,
    dtype_bytes: int = 2,
    bits: float | None = None,
    mtp: bool = False,
    vision: bool = False,
) -> dict[str, int]:
    """Bytes per kind for the model's shapes under a recipe (bits overrides the matrices' bits/weight)."""
    if recipe not in RECIPES:
        raise NinferError(f"unknown recipe '{recipe}'; use one of {', '.join(RECIPES)}")
    if bits is not None and not 1.0 <= bits <= 16.0:
        raise NinferError(f"--bits {bits} is outside 1..16 bits per weight")
    out: dict[str, int] = dict.fromkeys(KINDS, 0)
    for name, shape in model_tensors(config):
        out[tensor_kind(name, shape)] += recipe_tensor_bytes(name, shape, recipe, dtype_bytes, bits)
    if mtp:
        for name, shape in mtp_tensors(config):
            out["mtp head"] += recipe_tensor_bytes(name, shape, recipe, dtype_bytes, bits)
    if vision:
        out["vision tower"] = sum(math.prod(s) for _, s in vision_tensors(config)) * dtype_bytes
    return out


def artifact_weight_bytes(
    path: Path, config: ModelConfig, dtype_bytes: int = 2, mtp: bool = False, vision: bool = False
) -> dict[str, int]:
    """Bytes per kind of a `.ninfer` artifact as the CUDA loader keeps it (see the module docstring)."""
    from engine.formats.container import read_header

    header = read_header(path)
    quant = json.loads(header["__metadata__"].get("quant") or "{}")
    parts = {f"{n}.{p}" for n in quant for p in ("qpacked", "qscales", "qmins")}
    # a mixture of experts' matrices stay packed, stacked, where every expert of a layer's gate|up or down is
    # quantized alike (engine/layers/moe.pack_experts); otherwise they are dequantized into the stack
    layouts: dict[str, set] = defaultdict(set)
    for name, q in quant.items():
        if (expert := expert_shard(name)) is not None:
            layouts[expert[0]].add((q["bits"], q["group_size"], q["shape"][1]))
    tensors: list[tuple[str, tuple[int, ...], int | None]] = []
    for name, q in quant.items():
        stored = sum(
            _span(header[p]) for p in (f"{name}.qpacked", f"{name}.qscales", f"{name}.qmins") if p in header
        )
        expert = expert_shard(name)
        if expert is None:
            packed = fused_kernel_takes(q["bits"], q["group_size"])
        else:
            packed = stack_stays_packed(layouts[expert[0]])
        tensors.append((name, tuple(q["shape"]), stored if packed else None))
    for name, info in header.items():
        if name != "__metadata__" and name not in parts:
            tensors.append((name, tuple(info["shape"]), None))
    return held_weight_bytes(tensors, config, dtype_bytes, mtp, vision)


def int_checkpoint_weight_bytes(
    shapes: dict[str, tuple[int, ...]],
    scheme: IntScheme,
    config: ModelConfig,
    dtype_bytes: int = 2,
    mtp: bool = False,
    vision: bool = False,
) -> dict[str, int]:
    """Bytes per kind of an integer-quantized checkpoint (`shapes`: its tensors', from the file headers) as
    the CUDA loader holds it (engine/formats/hf_intq.py): each 4- or 8-bit layer packed at ninfer's layout
    (codes, fp16 scales, and minimums at 4 bits, a group) where the kernel takes its group, the rest in the
    model dtype. Act-order layers add their column order (int32 a column)."""
    parts, bits, words = PARTS[scheme.method], scheme.bits, 32 // scheme.bits
    layers = {name.rpartition(".")[0] for name in shapes if name.rpartition(".")[2] == parts[0]}
    matrices: dict[str, tuple[int, int]] = {}
    for prefix in layers:
        if scheme.method == "int8":  # the int8 weight [N, K] itself
            n, k = shapes[f"{prefix}.weight"]
        elif scheme.method == "compressed-tensors":  # weight_packed [N, K / words]
            n, k = shapes[f"{prefix}.weight_packed"][0], words * shapes[f"{prefix}.weight_packed"][1]
        else:  # AWQ's qweight [K, N / 8], GPTQ's [K / words, N]; scales [K / G, N]
            rows, n = shapes[f"{prefix}.qweight"][0], shapes[f"{prefix}.scales"][1]
            k = rows if scheme.method == "awq" else words * rows
        matrices[f"{prefix}.weight"] = (n, k)

    def group_of(k: int) -> int:  # (8-bit scales a row are spread over groups of 128, as the loader does)
        if scheme.group_size > 0:
            return scheme.group_size
        return fitting_group(k, ROW_GROUP) if bits == 8 else k

    layouts: dict[str, set] = defaultdict(set)
    for name, (_, k) in matrices.items():
        if (expert := expert_shard(name)) is not None:
            layouts[expert[0]].add((bits, group_of(k), k))
    tensors: list[tuple[str, tuple[int, ...], int | None]] = []
    for name, (n, k) in matrices.items():
        expert = expert_shard(name)
        takes = fused_kernel_takes(bits, group_of(k))
        packed = takes if expert is None else stack_stays_packed(layouts[expert[0]])
        held_bytes = stored_nbytes((n, k), bits, group_of(k)) + (4 * k if scheme.act_order else 0)
        tensors.append((name, (n, k), held_bytes if packed else None))
    held = {f"{prefix}.{part}" for prefix in layers for part in parts}
    tensors += [(name, shape, None) for name, shape in shapes.items() if name not in held]
    return held_weight_bytes(tensors, config, dtype_bytes, mtp, vision)


def fp4_checkpoint_weight_bytes(
    shapes: dict[str, tuple[int, ...]],
    scheme: Fp4Scheme,
    config: ModelConfig,
    dtype_bytes: int = 2,
    mtp: bool = False,
    vision: bool = False,
) -> tuple[dict[str, int], bool]:
    """fp4_held_bytes of an NVFP4 / MXFP4 checkpoint (`shapes`: its tensors', from the file headers)."""
    layers, rest = fp4_layers(list(shapes), scheme)
    codes = [shapes[f"{layer}.{scheme.codes_name}"] for layer in layers]  # [N, K / 2] each
    matrices = [(f"{layer}.weight", (n, 2 * half)) for layer, (n, half) in zip(layers, codes)]
    dense = [(n, shapes[n]) for n in rest]
    return fp4_held_bytes(matrices, dense, scheme.group, config, dtype_bytes, mtp, vision)


def fp4_held_bytes(
    matrices: list[tuple[str, tuple[int, int]]],
    dense: list[tuple[str, tuple[int, ...]]],
    group: int,
    config: ModelConfig,
    dtype_bytes: int = 2,
    mtp: bool = False,
    vision: bool = False,
) -> tuple[dict[str, int], bool]:
    """(Bytes per kind, whether an expert's matrix takes 8-bit groups) of a model whose `matrices` ([N, K]
    each) are FP4 and `dense` tensors 16-bit, as the CUDA loader holds them under weight_quant auto
    (engine/models/loader.load_keeping_quantized): each FP4 matrix as stored (codes, a byte a group's
    scale, an fp32 tensor scale a row), a mixture of experts' too where K is whole groups (else 8-bit
    groups of 128); the rest in the model dtype."""
    tensors: list[tuple[str, tuple[int, ...], int | None]] = []
    experts = False
    for name, (n, k) in matrices:
        if expert_shard(name) is not None and k % group:  # (the FP4 experts' kernel takes whole groups)
            experts, held = True, stored_nbytes((n, k), 8, GROUP_SIZE)
        else:
            held = n * (k // 2) + n * -(-k // group) + 4 * n
        tensors.append((name, (n, k), held))
    tensors += [(name, shape, None) for name, shape in dense]
    return held_weight_bytes(tensors, config, dtype_bytes, mtp, vision), experts


def held_weight_bytes(
    tensors: list[tuple[str, tuple[int, ...], int | None]],
    config: ModelConfig,
    dtype_bytes: int = 2,
    mtp: bool = False,
    vision: bool = False,
) -> dict[str, int]:
    """Bytes per kind of tensors as the CUDA loader holds them, each (name, shape, bytes held packed or None
    where it is held dense in the model dtype). With `mtp`, the file's own MTP head (mtp.*), or, where it
    stores none, one counted from the config; a vision tower counted from the config."""
    out: dict[str, int] = dict.fromkeys(KINDS, 0)
    packed_bytes = packed_weights = 0  # over the matrices kept packed: their average bits for the MTP head
    stored_mtp = any(name.startswith("mtp.") for name, *_ in tensors)
    for name, shape, held in tensors:
        if is_tower(name):  # the file's own vision tower: held only with --vision, counted below
            continue
        if name.startswith("mtp."):  # the file's own MTP head: held only with --spec mtp
            if mtp:
                out["mtp head"] += math.prod(shape) * dtype_bytes if held is None else held
            continue
        if held is None:
            out[tensor_kind(name, shape)] += math.prod(shape) * dtype_bytes
            continue
        out[tensor_kind(name, shape)] += held
        packed_bytes, packed_weights = packed_bytes + held, packed_weights + math.prod(shape)
    if mtp and not stored_mtp:  # a head the file lacks: counted at its matrices' average packed bits
        bits = 8 * packed_bytes / packed_weights if packed_weights else None
        for name, shape in mtp_tensors(config):
            out["mtp head"] += recipe_tensor_bytes(name, shape, "bf16", dtype_bytes, bits)
    if vision:
        out["vision tower"] = sum(math.prod(s) for _, s in vision_tensors(config)) * dtype_bytes
    return out


def _span(info: dict) -> int:
    start, end = info["data_offsets"]
    return end - start
