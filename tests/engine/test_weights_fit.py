"""Before the weights load on a GPU (engine/plan/preload.py): counted as `plan` counts them, at the precision
the loader will hold them; more than the memory free is refused in one sentence with the ways that fit."""

from __future__ import annotations

import re

import pytest
from conftest import save_tiny, tiny_hf_model

from engine.config import EngineConfig
from engine.errors import NinferError
from engine.formats.hf_dir import load_hf_dir
from engine.models.loader import open_source
from engine.plan.model import resolve
from engine.plan.preload import check_weights_fit, load_recipe
from engine.quant.convert import convert


def _bytes(path, recipe=None) -> int:
    return sum(resolve(str(path), None, recipe, None, False, False).weights.values())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path_factory.mktemp("fit") / "m")


def test_a_checkpoint_that_does_not_fit_is_refused_with_what_fits(checkpoint):
    config = EngineConfig(model=str(checkpoint), dtype="bfloat16")
    source = load_hf_dir(checkpoint)
    need, eight, four = _bytes(checkpoint), _bytes(checkpoint, "w8g128"), _bytes(checkpoint, "w4g128")
    assert four < eight < need
    check_weights_fit(source, config, need)  # exactly enough: loads
    with pytest.raises(NinferError) as caught:
        check_weights_fit(source, config, need - 1)
    message = str(caught.value)
    assert message.startswith(f"the weights take {need / 2**30:.2f} GiB as they load (bf16), more than the ")
    assert "hold them at fewer bits as they load: --weight-quant int8 (" in message
    assert "or --weight-quant int4 (" in message and f"`ninfer plan {checkpoint}`" in message
    with pytest.raises(NinferError, match=r"as they load: --weight-quant int4 \([0-9.]+ GiB\) \("):
        check_weights_fit(source, config, four)  # only 4 bits fit
    with pytest.raises(NinferError, match=f"even at 4 bits a weight they take {four / 2**30:.2f} GiB: a GPU"):
        check_weights_fit(source, config, four - 1)
    # held at 4 bits as it loads: counted so
    int4 = EngineConfig(model=str(checkpoint), dtype="bfloat16", weight_quant="int4")
    check_weights_fit(source, int4, four)
    with pytest.raises(NinferError, match=r"\(w4g128\).*even at 4 bits a weight"):
        check_weights_fit(source, int4, four - 1)


def test_an_artifact_is_counted_as_stored(checkpoint, tmp_path):
    out = tmp_path / "m.ninfer"
    convert(checkpoint, out, "w4g128", method="rtn")
    source = open_source(out)
    assert load_recipe(source, "auto") is None
    need = _bytes(out)
    config = EngineConfig(model=str(out), dtype="bfloat16")
    check_weights_fit(source, config, need)
    with pytest.raises(
        NinferError, match=re.escape("(w4g128 (as stored)), more than") + ".*: an artifact of fewer"
    ):
        check_weights_fit(source, config, need - 1)


def test_an_fp8_checkpoint_counts_at_the_width_it_loads_at(tmp_path):
    from test_hf_quant import save_fp8_blocks

    model = tiny_hf_model("qwen3", tied=False, seed=3)
    fp8 = save_fp8_blocks(model, tmp_path / "fp8")
    source = load_hf_dir(fp8)
    assert load_recipe(source, "auto") is None and load_recipe(source, "none") == "bf16"
    assert load_recipe(source, "int4") == "w4g128"
    eight, sixteen = _bytes(fp8), _bytes(fp8, "bf16")
    check_weights_fit(source, EngineConfig(model=str(fp8), dtype="bfloat16"), eight)
    with pytest.raises(NinferError, match=r"\(bf16\).*--weight-quant int8"):
        check_weights_fit(source, EngineConfig(model=str(fp8), dtype="bfloat16", weight_quant="none"), eight)
    assert eight < sixteen


def test_a_draft_model_is_counted_beside_the_model(checkpoint, tmp_path):
    from engine.spec.draft_model import open_draft_model

    draft_dir = save_tiny(tiny_hf_model("qwen3", tied=True, seed=5, hidden_size=32), tmp_path / "d")
    config = EngineConfig(model=str(checkpoint), dtype="bfloat16", spec="draft", draft_model=str(draft_dir))
    source = load_hf_dir(checkpoint)
    draft = open_draft_model(config, source.config, source.tokenizer)
    need = _bytes(checkpoint) + _bytes(draft_dir)
    assert _bytes(draft_dir) > 0
    check_weights_fit(source, config, need, draft)  # both fit exactly
    check_weights_fit(source, config, _bytes(checkpoint))  # (the model alone fits what both do not)
    with pytest.raises(NinferError) as caught:
        check_weights_fit(source, config, need - 1, draft)
    message = str(caught.value)
    assert f"take {need / 2**30:.2f} GiB as they load (bf16; draft model bf16)" in message
    assert "--weight-quant int8" in message and message.endswith(
        f"or a smaller draft model (`ninfer plan {checkpoint}` shows the whole ledger)"
    )
    # held at 4 bits as they load: both counted so
    four = _bytes(checkpoint, "w4g128") + _bytes(draft_dir, "w4g128")
    int4 = EngineConfig(
        model=str(checkpoint), dtype="bfloat16", weight_quant="int4", spec="draft", draft_model=str(draft_dir)
    )
    check_weights_fit(source, int4, four, draft)
    with pytest.raises(NinferError, match=r"\(w4g128; draft model w4g128\)"):
        check_weights_fit(source, int4, four - 1, draft)
