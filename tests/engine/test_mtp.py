"""Drafts from the MTP head (spec mtp) against a reference built from transformers' own Qwen3.5 decoder
layer, and output unchanged by them.

transformers does not run the MTP head, so the reference is written here from the architecture: the final-
normed hidden state h_p of the model and the embedding of the token at p + 1, each RMS-normed (1 + w),
concatenated [embedding | hidden], through `fc`, one full-attention decoder layer over those rows (causal),
the head's norm, the model's lm_head: the token at p + 2. A chained draft appends a row made of the draft
just predicted and the head's own output at the previous row.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import mtp_head_tensors, save_mtp_head, save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.sample.race import race_key, race_params, race_pick

PROMPT = [5, 9, 200, 31, 77, 5, 9, 200, 31, 77, 5, 9, 140, 7]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def add_mtp_head(model, path, seed: int = 5):
    """Random mtp.* tensors written beside the checkpoint; returned by name."""
    tensors = mtp_head_tensors(model, seed)
    save_mtp_head(path, tensors)
    return tensors


@torch.no_grad()
def reference_drafts(
    model,
    tensors: dict,
    tokens: list[int],
    k: int,
    vocab: int | None = None,
    sampled: SamplingParams | None = None,
) -> list[int]:
    """The head's k drafts after `tokens` (the model has run all but the last; the last is the token the
    step emitted), chosen among the first `vocab` token ids (all by default): its argmax, or for a `sampled`
    request (seeded) its winner of the race at the draft's position (engine/sample/race.py)."""
    import transformers as tf

    mod = tf.models.qwen3_5.modeling_qwen3_5
    cfg = model.config
    layer = mod.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
    layer.load_state_dict(
        {n[len("mtp.layers.0.") :]: t for n, t in tensors.items() if n.startswith("mtp.layers.0.")}
    )

    def norm(name):
        n = mod.Qwen3_5RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        n.weight.copy_(tensors[f"mtp.{name}.weight"])
        return n

    norm_e, norm_h, norm_out = norm("pre_fc_norm_embedding"), norm("pre_fc_norm_hidden"), norm("norm")
    embed, lm_head = model.model.embed_tokens, model.lm_head
    hidden = model.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]  # [L, H], final-normed
    rows = (
        torch.cat([norm_e(embed(torch.tensor(tokens[1:]))), norm_h(hidden)], dim=-1)
        @ tensors["mtp.fc.weight"].t()
    )
    drafts = []
    for _ in range(k):
        n = rows.shape[0]
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = layer(
            rows[None], model.model.rotary_emb(rows[None], pos), attention_mask=mask, position_ids=pos
        )
        out = norm_out(out[0] if isinstance(out, tuple) else out)[0]  # [n, H]
        logits = lm_head(out[-1])[:vocab]
        if sampled is None:
            drafts.append(int(logits.argmax()))
        else:
            key = torch.tensor([race_key(sampled.seed, len(tokens) + len(drafts))])
            drafts.append(int(race_pick(logits[None], key, torch.tensor([race_params(sampled)]))[0]))
        new = torch.cat([norm_e(embed(torch.tensor([drafts[-1]]))), norm_h(out[-1:])], dim=-1)
        rows = torch.cat([rows, new @ tensors["mtp.fc.weight"].t()])
    return drafts


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    model = tiny_hf_model("qwen3_5", tied=False)
    path = save_tiny(model, tmp_path_factory.mktemp("mtp"))
    return model, path, add_mtp_head(model, path)


SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=4, max_tokens=8, ignore_eos=True)


@pytest.mark.parametrize("sampled", [None, SAMPLED], ids=["greedy", "sampled"])
def test_drafts_equal_the_reference_head_after_prefill_and_decode_steps(mtp_model, sampled):
    """A greedy request's drafts are the head's argmax; a sampled one's its winners of the race the sampler
    runs at each draft's position."""
    model, path, tensors = mtp_model
    llm = LLM(path, spec="mtp", draft_tokens=3, enable_prefix_caching=False)
    params = sampled or SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    rid = llm.add_request(PROMPT, params)
    for _ in range(3):  # the prefill step, then two decode steps verifying the head's drafts
        llm.step()
        tokens = PROMPT + llm.scheduler.requests[rid].output_token_ids
        num_tokens, drafts = llm.scheduler.proposer._drafts[rid]
        assert num_tokens == len(tokens)
        assert drafts == reference_drafts(model, tensors, tokens, 3, sampled=sampled)


def test_greedy_output_unchanged_and_sampled_reproducible(mtp_model):
    _, path, _ = mtp_model
    prompts = [PROMPT, list(range(40, 75))]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    reference = LLM(path).generate(prompt_token_ids=prompts, sampling_params=greedy)
    llm = LLM(path, spec="mtp", draft_tokens=3)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
    assert [o.token_ids for o in got] == [r.token_ids for r in reference]
    assert llm.scheduler.num_draft_tokens > 0
    sampled = SamplingParams(temperature=0.9, max_tokens=16, ignore_eos=True, seed=3)
    runs = [
        LLM(path, spec="mtp").generate(prompt_token_ids=prompts, sampling_params=sampled) for _ in range(2)
    ]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    plain = LLM(path).generate(prompt_token_ids=prompts, sampling_params=sampled)
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in plain]  # raced drafts or none


def test_a_prediction_drafts_before_the_head_and_leaves_the_output(mtp_model):
    """Predicted Outputs under spec mtp: the prediction's drafts (right, then edited) run where the head's
    would; the head's KV still follows the tokens that stand, so its drafts after the edit are its own."""
    _, path, _ = mtp_model
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    reference = LLM(path).generate(prompt_token_ids=[PROMPT], sampling_params=greedy)[0].token_ids
    llm = LLM(path, spec="mtp", draft_tokens=3)
    prediction = reference[:10] + [1, 2, 3]  # right for 10 tokens, then wrong, then nothing
    got = llm.generate(
        prompt_token_ids=[PROMPT], sampling_params=dataclasses.replace(greedy, prediction=prediction)
    )[0]
    assert got.token_ids == reference
    assert 0 < got.num_accepted_prediction_tokens < got.num_prediction_tokens < got.num_draft_tokens


@pytest.mark.parametrize("weight_quant", ["none", "int8"])
def test_lm_head_draft_chooses_among_the_first_token_ids(mtp_model, weight_quant):
    """lm_head_draft: the drafts come from the head's first N rows (on the CPU quantized as lm_head is),
    and output is still plain decoding's."""
    model, path, tensors = mtp_model
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    llm = LLM(
        path,
        spec="mtp",
        draft_tokens=3,
        lm_head_draft=100,
        weight_quant=weight_quant,
        enable_prefix_caching=False,
    )
    assert llm.model.draft_head.out_features == 100
    rid = llm.add_request(PROMPT, params)
    llm.step()
    tokens = PROMPT + llm.scheduler.requests[rid].output_token_ids
    drafts = llm.scheduler.proposer._drafts[rid][1]
    assert all(d < 100 for d in drafts)
    if weight_quant == "none":
        assert drafts == reference_drafts(model, tensors, tokens, 3, vocab=100)
        # a sampled request races the same 100 ids: the sampler's noise of those ids
        sampled = dataclasses.replace(SAMPLED, top_k=0, top_p=1.0)  # no truncation: the whole race
        rid_s = llm.add_request(PROMPT, sampled)
        llm.step()
        tokens_s = PROMPT + llm.scheduler.requests[rid_s].output_token_ids
        want = reference_drafts(model, tensors, tokens_s, 3, vocab=100, sampled=sampled)
        assert llm.scheduler.proposer._drafts[rid_s][1] == want
    while llm.has_unfinished_requests():
        llm.step()
    plain = LLM(path, weight_quant=weight_quant).generate(prompt_token_ids=PROMPT, sampling_params=params)[0]
    assert llm.scheduler.requests.get(rid) is None
    got = LLM(path, spec="mtp", lm_head_draft=100, weight_quant=weight_quant).generate(
        prompt_token_ids=PROMPT, sampling_params=params
    )[0]
    assert got.token_ids == plain.token_ids
    with pytest.raises(
        NinferError, match="lm_head_draft narrows the MTP head's drafts; use it with spec mtp"
    ):
        LLM(path, spec="ngram", lm_head_draft=100)


def test_a_model_without_an_mtp_head_is_refused(tmp_path):
    path = save_tiny(tiny_hf_model("qwen3", tied=False), tmp_path / "qwen3")
    with pytest.raises(NinferError, match="no MTP head .*use spec ngram or none"):
        LLM(path, spec="mtp")
    # a config that declares the head over a checkpoint without its tensors
    model = tiny_hf_model("qwen3_5", tied=False)
    path = save_mtp_head(save_tiny(model, tmp_path / "q35"), {})
    (path / "mtp.safetensors").unlink()
    with pytest.raises(
        NinferError, match=r"declares an MTP head but lacks its weights \(mtp\..*use spec ngram"
    ):
        LLM(path, spec="mtp")
    assert LLM(path).generate(prompt_token_ids=PROMPT, sampling_params=SamplingParams(max_tokens=2))


@pytest.mark.gpu
def test_mtp_drafts_on_cuda_with_graphs(mtp_model):
    """On a GPU the step replays a CUDA graph that also returns its hidden states; the head's pass runs
    eagerly and its chained steps replay their own graphs; the drafts equal the CPU's (fp32) and the
    output is plain decoding's."""
    _, path, _ = mtp_model
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    cpu = LLM(path, spec="mtp", draft_tokens=3)
    cuda = LLM(path, spec="mtp", draft_tokens=3, device="cuda", dtype="float32")
    assert cuda.runner.graphs is not None and cuda.runner.drafter.graphs is not None
    plain = LLM(path, device="cuda", dtype="float32").generate(
        prompt_token_ids=[PROMPT], sampling_params=greedy
    )
    got = cuda.generate(prompt_token_ids=[PROMPT], sampling_params=greedy)
    assert got[0].token_ids == plain[0].token_ids
    assert (
        got[0].num_draft_tokens
        == cpu.generate(prompt_token_ids=[PROMPT], sampling_params=greedy)[0].num_draft_tokens
    )


def test_mtp_with_a_packed_draft_head(mtp_model, tmp_path, kernel_backend):
    """A w4g128 artifact where the fused kernels run (CUDA; here the Triton kernels forced under the
    interpreter) keeps lm_head packed; lm_head_draft's head is its first rows (views)."""
    from engine.quant.convert import convert

    _, path, _ = mtp_model
    artifact = tmp_path / "mtp-w4.ninfer"
    convert(path, artifact, "w4g128", method="rtn")
    kernel_backend("triton")
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    options = dict(device=DEVICE, weight_quant="none")
    plain = LLM(artifact, **options).generate(prompt_token_ids=[PROMPT], sampling_params=greedy)[0]
    llm = LLM(artifact, spec="mtp", lm_head_draft=100, **options)
    assert llm.model.lm_head.qweight is not None and llm.model.draft_head.qweight is not None
    got = llm.generate(prompt_token_ids=[PROMPT], sampling_params=greedy)[0]
    assert got.token_ids == plain.token_ids and got.num_draft_tokens > 0


def test_prefix_cache_hits_after_drafting_runs_keep_output(mtp_model):
    """Pages a drafting run completed (the model's KV and the head's, rewritten where drafts were
    rejected) and its state snapshots serve a follow-up prompt: the tokens equal a cold plain run's, and
    the head's drafts after the hit equal the reference's."""
    model, path, tensors = mtp_model
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    llm = LLM(path, spec="mtp", draft_tokens=3)
    first = llm.generate(prompt_token_ids=PROMPT * 3, sampling_params=params)[0]
    follow = PROMPT * 3 + first.token_ids + [11, 12, 13]
    cold = LLM(path, enable_prefix_caching=False).generate(prompt_token_ids=follow, sampling_params=params)[0]
    rid = llm.add_request(follow, params)
    out = llm.scheduler.requests[rid]
    while not out.output_token_ids:  # the prompt's uncached rest, in chunks ending at a snapshot point
        llm.step()
    assert out.num_cached_tokens > 0
    tokens = follow + out.output_token_ids
    assert llm.scheduler.proposer._drafts[rid][1] == reference_drafts(model, tensors, tokens, 3)
    while llm.has_unfinished_requests():
        llm.step()
    assert out.output_token_ids == cold.token_ids


@pytest.mark.parametrize("sampled", [None, SAMPLED], ids=["greedy", "sampled"])
def test_chained_drafts_through_the_graph_buffers(mtp_model, sampled):
    """The chained steps' CUDA-graph path (static buffers, padding rows, outputs reused across replays) run
    eagerly here: the drafts still equal the reference's (the raced graph's for a sampled request)."""
    from conftest import eager_replays

    from engine.spec.chain_graphs import mtp_chain_graphs

    model, path, tensors = mtp_model
    llm = LLM(path, spec="mtp", draft_tokens=4, enable_prefix_caching=False)
    chain = eager_replays(mtp_chain_graphs(llm.runner.drafter, 4, 32, torch.device("cpu"), torch.float32))
    llm.runner.drafter.graphs = chain
    assert chain.buckets == [1, 2, 4]
    params = sampled or SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    rids = [llm.add_request(p, params) for p in (PROMPT, PROMPT[3:])]
    for _ in range(3):
        llm.step()
        for rid in rids:
            tokens = (PROMPT if rid == rids[0] else PROMPT[3:]) + llm.scheduler.requests[rid].output_token_ids
            want = reference_drafts(model, tensors, tokens, 4, sampled=sampled)
            assert llm.scheduler.proposer._drafts[rid][1] == want
    assert chain.replays >= 9  # 3 chained steps a step, both requests in the bucket of 2
