"""YaRN: frequencies and attention factor against transformers, greedy parity past the original positions
(config.json and the --rope-scaling flag alike), the context limit it lifts, and the flag's forms."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_greedy_reference, rope_model_config, save_tiny, tiny_hf_model, write_config_gguf

from engine import LLM, SamplingParams
from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats import gguf as gguf_format
from engine.layers.rotary import cos_sin_cache_for, inv_freq_for
from engine.rope_scaling import attention_factor, parse_rope_scaling

ORIGINAL = 64  # the tiny models' trained positions; the prompts below run past them
GEN = 24


def _model_config(scaling, max_positions: int = 40960, partial: float = 1.0) -> ModelConfig:
    return rope_model_config(
        architecture="Qwen3ForCausalLM",
        rope_theta=1e6,
        max_position_embeddings=max_positions,
        partial_rotary_factor=partial,
    ).with_rope_scaling(scaling)


YARN_CASES = {
    "qwen3-recipe": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "betas-untruncated": {
        "rope_type": "yarn",
        "factor": 3.0,
        "original_max_position_embeddings": 8192,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
    },
    "mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },
    "given-attention-factor": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 16384,
        "attention_factor": 1.25,
    },
}


@pytest.mark.parametrize("partial", [1.0, 0.25])
@pytest.mark.parametrize("case", list(YARN_CASES))
def test_yarn_frequencies_and_attention_factor_match_transformers(case, partial):
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = YARN_CASES[case]
    params = {**scaling, "rope_theta": 1e6, "partial_rotary_factor": partial}
    cfg = tf.Qwen3Config(hidden_size=256, num_attention_heads=2, head_dim=128, rope_parameters=params)
    cfg.max_position_embeddings = 40960
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    config = _model_config(scaling, partial=partial)
    assert torch.allclose(inv_freq_for(config), want.float(), rtol=1e-6, atol=0)
    assert attention_factor(config.rope_scaling) == pytest.approx(want_factor, rel=1e-12)
    cache = cos_sin_cache_for(config, torch.device("cpu"))  # [positions, rotary_dim]: cos | sin, scaled
    assert cache.shape == (config.position_limit, config.rotary_dim)
    assert cache[0, 0].item() == pytest.approx(want_factor, rel=1e-6)  # cos(0) x the attention factor


def test_yarn_stretches_the_position_limit_to_original_times_factor():
    assert _model_config(YARN_CASES["qwen3-recipe"]).position_limit == 131072  # Qwen3's card: 32K x 4
    assert _model_config(None).position_limit == 40960
    # no original context: the checkpoint's own positions are stretched (transformers, llama.cpp)
    stretched = _model_config({"rope_type": "yarn", "factor": 2.0})
    assert stretched.rope_scaling["original_max_position_embeddings"] == 40960
    assert stretched.position_limit == 81920
    # a config whose max_position_embeddings is already past original x factor keeps it
    assert _model_config(YARN_CASES["mscale"], max_positions=262144).position_limit == 262144


def test_the_flag_forms():
    assert parse_rope_scaling("yarn:4") == {"rope_type": "yarn", "factor": 4.0}
    assert parse_rope_scaling("YaRN:4:32k") == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    assert parse_rope_scaling("yarn:2.5:40960")["original_max_position_embeddings"] == 40960
    assert parse_rope_scaling("none") is None
    text = json.dumps(YARN_CASES["betas-untruncated"])
    assert parse_rope_scaling(text) == YARN_CASES["betas-untruncated"]
    assert parse_rope_scaling('{"rope_type": "default"}') is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("yarn", "is not understood; use yarn:FACTOR"),
        ("dynamic:4", "is not understood; use yarn:FACTOR"),
        ("yarn:four", "the factor is a number"),
        ("yarn:4:lots", "the original context a size"),
        ("yarn:4:32768:1", "too many parts"),
        ("yarn:0.5", "the yarn factor must be a number >= 1 (got 0.5)"),
        ("{bad json", "--rope-scaling is not valid JSON"),
        ("[4]", "'\\[4\\]' is not understood"),
        ('{"rope_type": "dynamic", "factor": 2}', "rope scaling 'dynamic' is not supported"),
        ('{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": -1}', "positive whole"),
        ('{"rope_type": "yarn", "factor": 4, "beta_fast": "x"}', "yarn's beta_fast must be a number"),
        ('{"rope_type": "llama3", "factor": 8}', "llama3 rope scaling needs low_freq_factor"),
    ],
)
def test_bad_flags_are_refused_in_one_line(text, message):
    with pytest.raises(NinferError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        parse_rope_scaling(text)
    assert "\n" not in str(e.value)


def test_an_engine_refuses_a_bad_flag_before_loading_anything(tmp_path):
    with pytest.raises(NinferError, match="--rope-scaling 'yarn' is not understood"):
        LLM(tmp_path / "nothing-here", rope_scaling="yarn")


def _prompt(n: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _assert_parity(llm, ref, ids):
    ref_tokens, ref_logprobs = hf_greedy_reference(ref, ids, GEN)
    params = SamplingParams(max_tokens=GEN, temperature=0.0, logprobs=1, ignore_eos=True)
    ours = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    for step, (tok, ref_tok) in enumerate(zip(ours.token_ids, ref_tokens)):
        assert abs(ours.logprobs[step][tok] - ref_logprobs[step][tok].item()) <= 1e-4, f"step {step}"
        if tok != ref_tok:  # only at a numerical tie
            top2 = torch.topk(ref_logprobs[step], 2).values
            assert (top2[0] - top2[1]).item() < 1e-3, f"token differs at step {step} without a tie"
            return
    return ours.token_ids


YARN_4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def yarn_pair(request, tmp_path_factory):
    """transformers with YaRN in its config, and the same weights saved with and without it."""
    arch = request.param
    rope = {"rope_theta": 1e7, "partial_rotary_factor": 0.25} if arch == "qwen3_5" else {"rope_theta": 1e6}
    ref = tiny_hf_model(
        arch, False, seed=7, max_position_embeddings=ORIGINAL, rope_parameters={**YARN_4, **rope}
    )
    with_yarn = save_tiny(ref, tmp_path_factory.mktemp(f"{arch}-yarn"))
    plain = tmp_path_factory.mktemp(f"{arch}-plain")
    save_tiny(ref, plain)
    cfg = json.loads((plain / "config.json").read_text())
    where = cfg.get("text_config", cfg)
    where["rope_parameters"] = {"rope_type": "default", **rope}
    where.pop("rope_scaling", None)
    (plain / "config.json").write_text(json.dumps(cfg))
    return ref, with_yarn, plain


def test_yarn_checkpoint_matches_transformers_past_its_original_positions(yarn_pair):
    ref, with_yarn, _ = yarn_pair
    llm = LLM(with_yarn, max_context=4 * ORIGINAL)
    assert llm.max_context == 4 * ORIGINAL
    ids = _prompt(150)  # 150 + 24 tokens: far past the 64 trained positions
    assert _assert_parity(llm, ref, ids) is not None


def test_the_flag_gives_the_checkpoint_the_same_yarn(yarn_pair):
    ref, with_yarn, plain = yarn_pair
    with pytest.raises(NinferError, match=r"beyond the model's 64 positions.*--rope-scaling yarn:4") as e:
        LLM(plain, max_context=4 * ORIGINAL)
    assert "\n" not in str(e.value)
    flagged = LLM(plain, max_context=4 * ORIGINAL, rope_scaling="yarn:4")
    ids = _prompt(150)
    params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True)
    baked = LLM(with_yarn, max_context=4 * ORIGINAL).generate(prompt_token_ids=ids, sampling_params=params)
    assert flagged.generate(prompt_token_ids=ids, sampling_params=params)[0].token_ids == baked[0].token_ids
    # and `none` takes the checkpoint's YaRN away again: back to its 64 positions
    with pytest.raises(NinferError, match=r"beyond the model's 64 positions \(max_position_embeddings\)"):
        LLM(with_yarn, max_context=4 * ORIGINAL, rope_scaling="none")
    with pytest.raises(
        NinferError, match=r"beyond the model's 256 positions \(YaRN x4 over 64\); use max_context 256"
    ):
        LLM(with_yarn, max_context=300)


def test_yarn_changes_what_the_model_computes(yarn_pair):
    """The parity above is not vacuous: the same weights without the scaling give other logprobs."""
    _, with_yarn, plain = yarn_pair
    ids = _prompt(40)  # within the unscaled limit, so both engines take it
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, ignore_eos=True)
    scaled = LLM(with_yarn).generate(prompt_token_ids=ids, sampling_params=params)[0]
    unscaled = LLM(plain).generate(prompt_token_ids=ids, sampling_params=params)[0]
    tok = scaled.token_ids[0]
    assert abs(scaled.logprobs[0][tok] - unscaled.logprobs[0].get(tok, -1e9)) > 1e-3


def _write_gguf(path, **rope_keys):
    keys = {"qwen3.attention.key_length": 128, **{f"qwen3.rope.scaling.{k}": v for k, v in rope_keys.items()}}
    return write_config_gguf(path, "qwen3", 40960, 1e6, keys)


def test_gguf_yarn_keys_are_read_into_the_config(tmp_path):
    reader = _write_gguf(tmp_path / "yarn.gguf", type="yarn", factor=4.0, original_context_length=32768)
    config = _config_from(reader, tmp_path / "yarn.gguf")
    assert config.rope_scaling == YARN_CASES["qwen3-recipe"]
    assert config.position_limit == 131072
    plain = _config_from(_write_gguf(tmp_path / "plain.gguf", type="none"), tmp_path / "plain.gguf")
    assert plain.rope_scaling is None and plain.position_limit == 40960
    odd = _write_gguf(tmp_path / "odd.gguf", type="longrope", factor=4.0)
    with pytest.raises(NinferError, match="rope scaling is 'longrope'.*pass --rope-scaling"):
        _config_from(odd, tmp_path / "odd.gguf")


def _config_from(reader, path):
    return gguf_format._config(reader, path)
