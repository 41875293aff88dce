"""Predicted Outputs: a request's prediction drafts where its output follows it (engine/spec/prediction.py),
found again after an edit; output unchanged by it; its drafts counted apart from the method's."""

from __future__ import annotations

import pytest
from conftest import save_tiny, tiny_hf_model

from engine import LLM, NinferError, SamplingParams
from engine.request import Request
from engine.spec.prediction import PredictionDrafts

# a file of distinct tokens: A, then B, then C (a run of 10 each)
A, B, C = list(range(100, 110)), list(range(200, 210)), list(range(300, 310))


def _request(prediction: list[int], output: list[int]) -> Request:
    req = Request("r", [1, 2, 3], SamplingParams(prediction=prediction))
    req.output_token_ids = list(output)
    return req


def _propose(drafts: PredictionDrafts, req: Request, output: list[int], k: int = 4) -> list[int]:
    req.output_token_ids = list(output)
    return drafts.propose(req, k)


def test_drafts_follow_the_output_through_the_prediction():
    drafts, req = PredictionDrafts(4, 4), _request(A + B, [])
    assert drafts.propose(req, 4) == A[:4]  # nothing generated yet: the prediction's start
    assert _propose(drafts, req, A[:3]) == A[3:7]
    assert _propose(drafts, req, A + B[:8]) == B[8:]  # near the end: what is left
    assert _propose(drafts, req, A + B) == []  # past the end


def test_an_insertion_or_a_deletion_is_found_again_from_the_outputs_last_tokens():
    drafts, req = PredictionDrafts(4, 4), _request(A + B + C, [])
    inserted = [900, 901, 902]
    assert _propose(drafts, req, A[:5] + inserted) == []  # departed: no drafts until it is found
    assert (
        _propose(drafts, req, A[:5] + inserted + A[5:7]) == A[7:] + B[:1]
    )  # back in step after the insertion
    other = PredictionDrafts(4, 4)  # a deletion: B left out, C follows A
    assert _propose(other, _request(A + B + C, []), A + C[:2]) == C[2:6]
    assert _propose(PredictionDrafts(4, 4), _request(A, []), [900, 901]) == []  # never in the prediction


def test_a_repeated_run_is_found_at_its_next_occurrence_not_its_first():
    drafts, req = PredictionDrafts(4, 4), _request(A + B + A + C, [])
    assert _propose(drafts, req, A + B + [900, 901] + A[:3]) == A[3:7]
    assert _propose(drafts, req, A + B + [900, 901] + A) == C[:4]  # the second A: C follows it
    assert _propose(PredictionDrafts(4, 4), _request(A + B + A + C, []), A + [900] + A[:4]) == A[4:8]


def test_drafts_reach_further_while_they_are_kept():
    """From `base` drafts, twice as many after a step that kept all of them, up to `most`; back to `base`
    after a rejection (the output departs from the prediction)."""
    file = A + B + C
    drafts, req = PredictionDrafts(2, 8), _request(file, [])
    assert drafts.propose(req, 16) == A[:2]
    assert _propose(drafts, req, A[:3], 16) == A[3:7]  # both kept (and the step's own token): 4 next
    assert _propose(drafts, req, A[:8], 16) == A[8:] + B[:6]  # 4 kept: 8 next
    assert _propose(drafts, req, A + B[:7], 16) == B[7:] + C[:5]  # 8 kept: 8 (the most)
    # 3 of 8 kept, then the output departs: found again, it starts from 2
    out = A + B + [900, 901, 902] + C[:3]
    assert _propose(drafts, req, A + B + [900], 16) == []
    assert _propose(drafts, req, out, 16) == C[3:5]


def test_a_cut_output_is_followed_again_from_its_start():
    drafts, req = PredictionDrafts(4, 4), _request(A + B, [])
    assert _propose(drafts, req, A + B[:5]) == B[5:9]
    assert _propose(drafts, req, A[:4]) == A[4:8]  # tokens taken back (a stop string)


def test_bad_predictions_are_refused():
    with pytest.raises(NinferError, match="prediction must be a list of token ids"):
        SamplingParams(prediction=[5, -1])


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def model_dir(request, tmp_path_factory):
    return save_tiny(tiny_hf_model(request.param, tied=False), tmp_path_factory.mktemp(request.param))


PROMPT = [5, 9, 200, 31, 77, 40, 41, 42]


def _run(llm: LLM, prediction: list[int]):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prediction=prediction)
    return llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]


def test_output_unchanged_and_drafts_counted(model_dir):
    """The reference output as the prediction: every predicted draft accepted. An edited one (tokens
    replaced and inserted in the middle): the same output, some drafts rejected, and more accepted than
    with the prediction cut at the edit (its place was found again)."""
    reference = _run(LLM(model_dir), []).token_ids
    llm = LLM(model_dir, spec="ngram", draft_tokens=4)
    exact = _run(llm, reference)
    assert exact.token_ids == reference
    assert (
        exact.num_prediction_tokens > 0
        and exact.num_accepted_prediction_tokens == exact.num_prediction_tokens
    )
    edited = reference[:8] + [7, 8, 9] + reference[11:]
    edited = edited[:14] + [450, 451] + edited[14:]
    got = _run(llm, edited)
    assert got.token_ids == reference
    assert got.num_accepted_prediction_tokens < got.num_prediction_tokens
    cut = _run(llm, reference[:8])
    assert cut.token_ids == reference
    assert got.num_accepted_prediction_tokens > cut.num_accepted_prediction_tokens
    assert llm.scheduler.num_draft_tokens >= sum(o.num_prediction_tokens for o in (exact, got, cut))


def test_without_speculative_decoding_a_prediction_changes_nothing(model_dir):
    llm = LLM(model_dir)
    out = _run(llm, [5, 6, 7])
    assert out.token_ids == _run(llm, []).token_ids and out.num_prediction_tokens == 0
    with pytest.raises(NinferError, match="prediction holds token id 99999, outside the vocabulary"):
        _run(llm, [5, 99999])


def _steps(llm: LLM, prediction: list[int]) -> tuple[list[int], int]:
    """(output, engine steps it took)."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prediction=prediction)
    llm.add_request(PROMPT, params)
    steps, out = 0, None
    while llm.has_unfinished_requests():
        steps += 1
        for o, _ in llm.step():
            out = o
    return out.token_ids, steps


def test_a_prediction_drafts_further_than_the_draft_count(model_dir):
    """--prediction-tokens: a followed prediction is soon verified 12 tokens a step while n-gram drafts stay
    at 2; the output is the same, in fewer steps; an edited prediction too (a hybrid model recomputes up to 12
    accepted tokens after a rejection)."""
    reference = _run(LLM(model_dir), []).token_ids
    far = LLM(model_dir, spec="ngram", draft_tokens=2, prediction_tokens=12)
    near = LLM(model_dir, spec="ngram", draft_tokens=2, prediction_tokens=2)
    assert far.engine_config.num_prediction_tokens == 12 and near.engine_config.num_prediction_tokens == 2
    out_far, steps_far = _steps(far, reference)
    out_near, steps_near = _steps(near, reference)
    assert out_far == out_near == reference
    # 1 + 2, 1 + 4, 1 + 8, then 1 + 12 tokens a step (24 in 4), against 3 a step (24 in 8)
    assert steps_far <= 5 and steps_near >= 8
    edited = reference[:10] + [450, 451] + reference[12:]
    assert _steps(far, edited)[0] == reference
    # by default a prediction drafts 16 a step (at least --draft-tokens); without spec, none
    assert LLM(model_dir, spec="ngram", draft_tokens=3).engine_config.num_prediction_tokens == 16
    assert LLM(model_dir).engine_config.num_prediction_tokens == 0
    with pytest.raises(NinferError, match="prediction_tokens must be between 1 and 64"):
        LLM(model_dir, spec="ngram", prediction_tokens=65)
    with pytest.raises(NinferError, match="needs speculative decoding; add --spec ngram"):
        LLM(model_dir, prediction_tokens=8)


@pytest.mark.gpu
def test_long_predicted_steps_on_cuda_between_graph_steps(model_dir):
    """On a GPU, a prediction's long steps (past the graphs' 1 + draft_tokens) run eagerly between graph
    replays, an edited prediction's rejections included; the output is plain decoding's."""
    options = dict(device="cuda", dtype="float32", max_concurrency=2)
    reference = _run(LLM(model_dir, **options), []).token_ids
    llm = LLM(model_dir, spec="ngram", draft_tokens=2, prediction_tokens=12, **options)
    assert llm.runner.graphs is not None and llm.runner.graphs.max_query == 3
    out, steps = _steps(llm, reference)
    assert out == reference and steps <= 5
    edited = reference[:10] + [450, 451] + reference[12:]
    assert _steps(llm, edited)[0] == reference
