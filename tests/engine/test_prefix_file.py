"""The prefix cache kept across restarts (--prefix-cache-file, engine/worker/prefix_file.py): what one engine
wrote at shutdown, the next one of the same model and KV layout reads into its host tier, so a prompt seen
before starts from cached pages (and, on a hybrid model, its state snapshot) and generates exactly what it
generated when computed; a file of another identity is not read; a path that is not such a file is refused."""

from __future__ import annotations

import logging

import pytest
from conftest import random_prompt, same_output, save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams

GEN = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix_file")
    return {
        arch: save_tiny(tiny_hf_model(arch, tied=False, head_dim=32), root / arch)
        for arch in ("qwen3", "qwen3_5")
    }


def _llm(path, file, **extra) -> LLM:
    options = dict(kv_capacity=256, max_context=128, max_concurrency=2, host_cache=1 << 20, state_snapshots=4)
    return LLM(path, prefix_cache_file=str(file), **{**options, **extra})


def _written(path, file, *batches, **extra):
    """An engine that ran each batch of prompts in turn, then wrote its prefix cache to `file`: (it, the
    batches' outputs)."""
    llm = _llm(path, file, **extra)
    outs = [llm.generate(prompt_token_ids=batch, sampling_params=GEN) for batch in batches]
    llm.save_prefix_cache()
    return llm, outs


@pytest.mark.parametrize("arch,kv_dtype", [("qwen3", "auto"), ("qwen3", "k8v4"), ("qwen3_5", "auto")])
def test_a_restart_starts_from_the_pages_the_last_run_left(models, tmp_path, arch, kv_dtype, caplog):
    file = tmp_path / "prefix.cache"
    a, b = random_prompt(50, 1), random_prompt(70, 2)
    _, (want,) = _written(models[arch], file, [a, b], kv_dtype=kv_dtype)
    assert file.exists() and not (tmp_path / "prefix.cache.tmp").exists()
    with caplog.at_level(logging.INFO, logger="ninfer"):
        again = _llm(models[arch], file, kv_dtype=kv_dtype)
    assert any("read into the host tier" in r.message for r in caplog.records)
    got = again.generate(prompt_token_ids=[a, b], sampling_params=GEN)
    # every full page but the prompt's last token's: 48 of 50, 64 of 70 (a hybrid's at its snapshots)
    assert [g.num_cached_tokens for g in got] == [48, 64]
    assert all(same_output(g, w) for g, w in zip(got, want))
    assert again.scheduler.block_pool.stats.host_hits == 48 + 64
    # without the file: computed again
    cold = _llm(models[arch], tmp_path / "other.cache", kv_dtype=kv_dtype)
    assert [o.num_cached_tokens for o in cold.generate(prompt_token_ids=[a, b], sampling_params=GEN)] == [
        0,
        0,
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_restart_on_cuda(models, tmp_path, arch):
    """On a GPU the pages come from the device pool (and a hybrid's snapshots from its state slots) and go
    back through the pinned host tier: the same cached tokens and output as on the CPU path."""
    file = tmp_path / "prefix.cache"
    a, b = random_prompt(50, 1), random_prompt(70, 2)
    cuda = dict(device="cuda", dtype="float32")
    _, (want,) = _written(models[arch], file, [a, b], **cuda)
    got = _llm(models[arch], file, **cuda).generate(prompt_token_ids=[a, b], sampling_params=GEN)
    assert [g.num_cached_tokens for g in got] == [48, 64]
    assert all(same_output(g, w) for g, w in zip(got, want))


def test_a_file_of_another_layout_is_not_read_and_is_replaced(models, tmp_path, caplog):
    file = tmp_path / "prefix.cache"
    a = random_prompt(50, 1)
    _written(models["qwen3"], file, [a])
    with caplog.at_level(logging.INFO, logger="ninfer"):
        other = _llm(models["qwen3"], file, kv_dtype="int8")
    assert any("written for another pages" in r.message for r in caplog.records)
    assert other.generate(prompt_token_ids=a, sampling_params=GEN)[0].num_cached_tokens == 0
    other.save_prefix_cache()  # now the int8 engine's
    assert (
        _llm(models["qwen3"], file, kv_dtype="int8")
        .generate(prompt_token_ids=a, sampling_params=GEN)[0]
        .num_cached_tokens
        == 48
    )
    # another model: not read either
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ninfer"):
        _llm(models["qwen3_5"], file, kv_dtype="int8")
    assert any("written for another model" in r.message for r in caplog.records)


def test_the_newest_pages_are_kept_when_the_tier_is_smaller(models, tmp_path):
    """A host tier smaller than the file: the most recently used pages come back (the later prompt's)."""
    file = tmp_path / "prefix.cache"
    a, b = random_prompt(50, 1), random_prompt(50, 2)
    first, _ = _written(models["qwen3"], file, [a], [b])
    page = first.runner.host_kv.num_bytes // first.runner.host_kv.num_slots
    small = _llm(models["qwen3"], file, host_cache=3 * page)
    assert small.generate(prompt_token_ids=b, sampling_params=GEN)[0].num_cached_tokens == 48
    assert small.generate(prompt_token_ids=a, sampling_params=GEN)[0].num_cached_tokens == 0


def test_what_cannot_be_a_prefix_cache_file_is_refused(models, tmp_path):
    weights = models["qwen3"] / "model.safetensors"
    with pytest.raises(
        NinferError, match="is not a ninfer prefix-cache file; it would be overwritten at shutdown"
    ):
        _llm(models["qwen3"], weights)
    garbage = tmp_path / "notes.txt"
    garbage.write_text("my notes")
    with pytest.raises(NinferError, match=r"is not a file ninfer wrote \(.*\); it would be overwritten"):
        _llm(models["qwen3"], garbage)
    with pytest.raises(NinferError, match="give --host-cache SIZE too"):
        LLM(models["qwen3"], prefix_cache_file=str(tmp_path / "p.cache"))
    with pytest.raises(NinferError, match="is not there or not writable"):
        _llm(models["qwen3"], tmp_path / "no" / "such" / "p.cache")


def test_a_file_whose_index_does_not_match_its_pages_is_not_read(models, tmp_path, caplog):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    file = tmp_path / "prefix.cache"
    a = random_prompt(50, 1)
    _written(models["qwen3"], file, [a])
    with safe_open(str(file), "pt") as f:
        meta = f.metadata()
    meta["pages"] += "," + "ab" * 16  # a page the tensors do not hold
    save_file(load_file(file), file, metadata=meta)
    with caplog.at_level(logging.INFO, logger="ninfer"):
        llm = _llm(models["qwen3"], file)
    assert any("does not hold what its index names" in r.message for r in caplog.records)
    assert llm.generate(prompt_token_ids=a, sampling_params=GEN)[0].num_cached_tokens == 0


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_an_empty_cache_writes_and_reads_an_empty_file(models, tmp_path, arch, caplog):
    file = tmp_path / "prefix.cache"
    _written(models[arch], file)
    with caplog.at_level(logging.INFO, logger="ninfer"):
        _llm(models[arch], file)
    assert any("0 pages (0 tokens)" in r.message for r in caplog.records)
