"""Before the weights load on a GPU: do they fit the memory free? Counted as `ninfer plan` counts them (the
same resolve, at the precision the loader will hold them), a checkpoint that does not fit is refused in one
sentence with the ways that do (held at fewer bits as it loads, converted, a bigger GPU), instead of running
out of memory half-way through the load."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.errors import NinferError
from engine.formats.source import ModelSource
from engine.plan.model import resolve

GIB = 1 << 30


def load_recipe(source: ModelSource, weight_quant: str) -> str | None:
    """The recipe `plan` counts a source at as this weight_quant loads it (None: as stored)."""
    if source.quantized_weights is not None:  # .ninfer, block-quantized GGUF, AWQ / GPTQ: as stored
        return None
    if weight_quant in ("int4", "int8"):  # quantized as it loads (engine/quant/on_load.py)
        return f"w{weight_quant[3]}g128"
    if weight_quant == "none" and source.stored_bits is not None:  # FP8 kept 16-bit
        return "bf16"
    return None


def check_weights_fit(
    source: ModelSource, config: EngineConfig, free: int, draft: ModelSource | None = None
) -> None:
    """NinferError when the weights, as they will be held, take more than `free` bytes of the device: the
    model's, and a spec draft model's (`draft`, opened) beside them."""
    try:
        need, recipe = _held(config, source, config.weight_quant, draft)
    except Exception:  # noqa: BLE001 - a source plan cannot count (an mmproj pairing it refuses, a config
        return  # it does not know): the estimate is no reason to stop a load; the load itself tells
    if need <= free:
        return
    if source.quantized_weights is None or (draft is not None and draft.quantized_weights is None):
        # a 16-bit (or FP8) source can be held at fewer bits as it loads
        fewer = {mode: _total(config, source, mode, draft) for mode in ("int8", "int4")}
        fitting = [
            f"--weight-quant {mode} ({size / GIB:.2f} GiB)"
            for mode, size in fewer.items()
            if mode != config.weight_quant and size <= free
        ]
        if fitting:
            way = "hold them at fewer bits as they load: " + " or ".join(fitting)
        else:
            way = f"even at 4 bits a weight they take {fewer['int4'] / GIB:.2f} GiB: a GPU with more memory"
    else:
        way = "an artifact of fewer bits a weight (ninfer convert ... --recipe w4g128) or a GPU with more memory"
    if draft is not None:
        way += " or a smaller draft model"
    raise NinferError(
        f"the weights take {need / GIB:.2f} GiB as they load ({recipe}), more than the {free / GIB:.2f} "
        f"GiB free on {config.device}: {way} (`ninfer plan {config.model}` shows the whole ledger)"
    )


def _held(
    config: EngineConfig, source: ModelSource, weight_quant: str, draft: ModelSource | None
) -> tuple[int, str]:
    """The bytes the model's weights (and the draft model's) take as held under weight_quant, and the
    recipe(s) counted, as `plan` says them."""
    dtype_bytes = config.torch_dtype.itemsize
    target = resolve(
        config.model,
        None,
        load_recipe(source, weight_quant),
        None,
        config.spec == "mtp",
        config.vision,
        dtype_bytes,
        config.mmproj,
    )
    need, recipe = sum(target.weights.values()), target.recipe
    if draft is not None:  # loaded as the target is (engine/spec/draft_model.py's load_draft_model)
        held = resolve(
            config.draft_model, None, load_recipe(draft, weight_quant), None, False, False, dtype_bytes
        )
        need += sum(held.weights.values())
        recipe += f"; draft model {held.recipe}"
    return need, recipe


def _total(config: EngineConfig, source: ModelSource, weight_quant: str, draft: ModelSource | None) -> int:
    """The weights' bytes under weight_quant; where plan cannot count them, more than any GPU holds."""
    try:
        return _held(config, source, weight_quant, draft)[0]
    except Exception:  # noqa: BLE001 - (as check_weights_fit's)
        return 1 << 62
