"""Embeddings (pooling "last", as Qwen3-Embedding pools): the final-normed hidden state at the prompt's last
token equals transformers' for a causal LM, a bare decoder (Qwen3Model) and a bare checkpoint whose config
names Qwen3ForCausalLM (as Qwen3-Embedding's does); prefix-cache hits and chunked prompts pool the same;
a model without a head makes no text."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import save_tiny, tiny_hf_model, write_config_gguf

from engine import LLM, NinferError, SamplingParams
from engine.formats import gguf as gguf_format
from engine.pooling import POOLED, normalized, truncated

PROMPTS = [[5, 17, 33, 2, 91, 45, 12, 7, 88, 3, 140, 61, 9, 27, 19, 4, 55, 76, 8], [3, 1, 4, 1, 5]]


def _reference(model, ids: list[int]) -> list[float]:
    decoder = getattr(model, "model", model)
    with torch.no_grad():
        hidden = decoder(torch.tensor([ids])).last_hidden_state[0, -1]
    return normalized(hidden.float().tolist())


def _close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < tol


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    model = tiny_hf_model("qwen3", tied=False)
    return model, save_tiny(model, tmp_path_factory.mktemp("causal"))


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_causal_lm_pools_its_last_hidden_state(tmp_path, arch):
    model = tiny_hf_model(arch, tied=arch == "qwen3_5")
    llm = LLM(save_tiny(model, tmp_path), block_size=8, prefill_chunk=8)  # prompts cross pages and chunks
    got = llm.embed(PROMPTS)
    for ids, vector in zip(PROMPTS, got):
        assert _close(vector, _reference(model, ids)), arch
        assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-6)
    # a repeat hits the prefix cache (the whole prompt but its last token): the same embedding
    again = llm.embed(PROMPTS[0])
    assert _close(again[0], got[0], 1e-5) and llm.scheduler.block_pool.enable_prefix_caching
    raw = llm.embed(PROMPTS[1], normalize=False)[0]
    assert _close(normalized(raw), got[1], 1e-6) and not math.isclose(sum(v * v for v in raw), 1.0)


def test_a_pooled_request_computes_no_logits_and_samples_no_token(causal, monkeypatch):
    """Its vector is all it asked for: the vocabulary head (the largest matrix of a small reranker) does
    not run for it, and no token is sampled. A generating request beside it in the same steps still is."""
    model, path = causal
    llm = LLM(path, block_size=8)
    heads = []
    compute_logits = llm.model.compute_logits
    monkeypatch.setattr(llm.model, "compute_logits", lambda h: heads.append(h.shape[0]) or compute_logits(h))
    outs = llm.generate(None, [POOLED, SamplingParams(max_tokens=3, temperature=0.0)], PROMPTS)
    assert _close(normalized(outs[0].embedding), _reference(model, PROMPTS[0]))
    assert outs[0].token_ids == [] and outs[0].finished and len(outs[1].token_ids) == 3
    assert heads and all(n == 1 for n in heads)  # the generating request's rows alone
    heads.clear()
    assert _close(llm.embed(PROMPTS[1])[0], _reference(model, PROMPTS[1])) and heads == []


def test_a_bare_decoder_embeds_and_makes_no_text(tmp_path):
    model = tiny_hf_model("qwen3", tied=False)
    save_tiny(model.model, tmp_path)  # transformers' Qwen3Model: no head, no "model." prefix
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3Model"]
    llm = LLM(tmp_path)
    assert llm.model.headless
    assert _close(llm.embed(PROMPTS[0])[0], _reference(model, PROMPTS[0]))
    with pytest.raises(NinferError, match="is an embedding model .* not text"):
        llm.generate(prompt_token_ids=PROMPTS[0], sampling_params=SamplingParams(max_tokens=3))


def test_a_bare_checkpoint_named_as_a_causal_lm_is_found_headless(tmp_path):
    """Qwen3-Embedding's config.json names Qwen3ForCausalLM (untied on the 8B) over bare decoder tensors."""
    model = tiny_hf_model("qwen3", tied=False)
    save_tiny(model.model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(architectures=["Qwen3ForCausalLM"], tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(tmp_path)
    assert llm.model.headless and llm.model.lm_head.weight is llm.model.model.embed_tokens.weight
    assert _close(llm.embed(PROMPTS[1])[0], _reference(model, PROMPTS[1]))


def test_pooling_is_checked_and_truncation_renormalizes():
    with pytest.raises(NinferError, match="pooling must be one of"):
        SamplingParams(pooling="mean")
    vector = [3.0, 4.0, 12.0]
    assert truncated(vector, 2, True) == [0.6, 0.8] and truncated(vector, None, False) == vector
    with pytest.raises(NinferError, match="dimensions must be between 1 and 3"):
        truncated(vector, 4, True)


def test_a_gguf_pooling_type_marks_an_embedding_model(tmp_path):
    """llama.cpp writes {arch}.pooling_type for embedding models: 3 (last) is one; mean and cls poolings are
    refused in one line (4, rank, is a reranker: tests/engine/test_rerank.py); a chat GGUF has none."""
    plain = write_config_gguf(tmp_path / "chat.gguf", "qwen3", 4096, 1e6)
    assert not gguf_format._config(plain, tmp_path / "chat.gguf").embedding_model
    last = write_config_gguf(tmp_path / "last.gguf", "qwen3", 4096, 1e6, {"qwen3.pooling_type": 3})
    assert gguf_format._config(last, tmp_path / "last.gguf").embedding_model
    mean = write_config_gguf(tmp_path / "mean.gguf", "qwen3", 4096, 1e6, {"qwen3.pooling_type": 1})
    with pytest.raises(NinferError, match="pooled by 'mean'; ninfer pools by the last token only"):
        gguf_format._config(mean, tmp_path / "mean.gguf")


def test_a_sentence_transformers_pooling_config_marks_or_refuses_an_embedding_model(causal, tmp_path):
    """Qwen3-Embedding ships 1_Pooling/config.json with last-token pooling: a prefixed causal checkpoint
    with it is an embedding model; another pooling is refused before anything loads."""
    import shutil

    model, path = causal
    marked = tmp_path / "marked"
    shutil.copytree(path, marked)
    (marked / "1_Pooling").mkdir()
    pooling = {
        "word_embedding_dimension": 64,
        "pooling_mode_lasttoken": True,
        "pooling_mode_mean_tokens": False,
    }
    (marked / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    llm = LLM(marked)
    assert llm.model.headless and _close(llm.embed(PROMPTS[0])[0], _reference(model, PROMPTS[0]))
    (marked / "1_Pooling" / "config.json").write_text(
        json.dumps({**pooling, "pooling_mode_lasttoken": False, "pooling_mode_mean_tokens": True})
    )
    with pytest.raises(NinferError, match="pooled by mean; ninfer pools by the last token only"):
        LLM(marked)
