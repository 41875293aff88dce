"""Decode steps through CUDA graphs: the static-buffer path (staging, padding rows, the full-width block
table) checked on any device by running it eagerly; capture and replay on CUDA."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model

from engine import LLM, SamplingParams
from engine.worker.cuda_graphs import DecodeGraphs

PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=1)


def _prompts() -> list[list[int]]:
    return [
        torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 40, 77)
    ]


class EagerGraphs(DecodeGraphs):
    """The graph path with replay run eagerly through the same static buffers (no capture off CUDA)."""

    replays = 0
    seen_queries: set[int] = set()

    def capture(self) -> None:
        pass

    def replay(self, n: int, q: int = 1, lora: bool = False) -> torch.Tensor:
        EagerGraphs.replays += 1
        EagerGraphs.seen_queries.add(q)
        return self.run_eager(n, q, lora)


@pytest.mark.parametrize(
    "arch,prefix_caching", [("llama", False), ("qwen3", False), ("qwen3_5", False), ("qwen3_5", True)]
)
def test_static_buffer_path_gives_the_eager_tokens(tmp_path, arch, prefix_caching):
    """Hybrid (Qwen3.5): the padding row's state slot is -1, so its Gated DeltaNet ops touch no state; with
    prefix caching, the step's state snapshots are copied after the graph's forward."""
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=11), tmp_path)
    options = dict(max_concurrency=4, enable_prefix_caching=prefix_caching, max_context=512)
    want = LLM(path, **options).generate(prompt_token_ids=_prompts(), sampling_params=PARAMS)
    llm = LLM(path, **options)
    llm.runner.graphs = EagerGraphs(llm.model, 4, 512 // llm.engine_config.block_size, llm.runner.device)
    assert llm.runner.graphs.buckets == [1, 2, 4]  # three requests: one padding row
    EagerGraphs.replays = 0
    got = llm.generate(prompt_token_ids=_prompts(), sampling_params=PARAMS)
    assert EagerGraphs.replays >= 9  # every pure decode step went through the buffers
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs):
            assert all(abs(a[t] - b[t]) < 1e-4 for t in b if t in a)
    if prefix_caching:  # follow-ups hit the snapshots taken in graph steps (past each prompt): cold tokens
        follow = [p + g.token_ids for p, g in zip(_prompts(), got)]
        again = llm.generate(prompt_token_ids=follow, sampling_params=PARAMS)
        cold = LLM(path, **{**options, "enable_prefix_caching": False})
        for a, c in zip(again, cold.generate(prompt_token_ids=follow, sampling_params=PARAMS)):
            assert a.token_ids == c.token_ids
        assert any(a.num_cached_tokens > len(p) for a, p in zip(again, _prompts()))


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("num_prompts", [3, 1])
def test_draft_verification_steps_replay_through_the_buffers(tmp_path, arch, num_prompts):
    """With drafts, steps of q = 1 + k tokens a sequence (a hybrid model after a rejection: its recomputed
    tokens and fewer drafts, the rows sampled picked from the graph's) go through the static buffers of
    their (bucket, q), padding sequences included, and give plain decoding's tokens."""
    from test_spec_decode import ScriptedDrafts

    prompts = _prompts()[:num_prompts]
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=11), tmp_path)
    options = dict(max_concurrency=4, max_context=512)
    want = LLM(path, **options).generate(prompt_token_ids=prompts, sampling_params=PARAMS)
    llm = LLM(path, spec="ngram", draft_tokens=3, **options)
    full = {f"req-{i}": p + w.token_ids for i, (p, w) in enumerate(zip(prompts, want))}
    llm.scheduler.proposer = ScriptedDrafts(full, 2, 3)
    graphs = EagerGraphs(llm.model, 4, 512 // llm.engine_config.block_size, llm.runner.device, max_query=4)
    llm.runner.graphs = graphs
    EagerGraphs.seen_queries = set()
    got = llm.generate(prompt_token_ids=prompts, sampling_params=PARAMS)
    assert 4 in EagerGraphs.seen_queries  # the last known token + 3 drafts (or recomputed tokens + drafts)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs):
            assert all(abs(a[t] - b[t]) < 1e-4 for t in b if t in a)
    assert 0 < llm.scheduler.num_accepted_tokens < llm.scheduler.num_draft_tokens


def test_staging_q_tokens_a_sequence_pads_whole_sequences():
    graphs = DecodeGraphs(None, 4, 6, torch.device("cpu"), max_query=2)
    assert graphs.query_counts == [1, 2]
    b = graphs.stage([7, 8, 9, 6], [4, 5, 10, 11], [36, 37, 91, 92], [6, 12], [[2], [5, 3]], [2, 0], q=2)
    assert b == 2
    assert graphs.cu_seqlens_q[2][: b + 1].tolist() == [0, 2, 4]
    b = graphs.stage(
        [7, 8, 9, 6, 1, 2], [4, 5, 10, 11, 0, 1], [36, 37, 91, 92, 4, 5], [6, 12, 2], [[2], [5, 3], [1]], q=2
    )
    assert b == 4
    assert graphs.input_ids.tolist() == [7, 8, 9, 6, 1, 2, 0, 0]
    assert graphs.slot_mapping.tolist() == [
        36,
        37,
        91,
        92,
        4,
        5,
        -1,
        -1,
    ]  # the padding sequence writes nothing
    assert graphs.seq_lens.tolist() == [6, 12, 2, 2]  # its two tokens are the last of a length-2 sequence
    assert graphs.state_indices.tolist() == [-1, -1, -1, -1]


def test_a_failed_capture_decodes_eagerly_and_says_why(caplog):
    from engine.worker.cuda_graphs import captured_or_none

    class Failing(DecodeGraphs):
        def capture(self) -> None:
            self.graphs[1] = object()  # a bucket captured before the failure
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    graphs = Failing(None, 2, 4, torch.device("cpu"))
    with caplog.at_level("WARNING", logger="ninfer.graphs"):
        assert captured_or_none(graphs) is None
    assert (
        "operation not permitted when stream is capturing" in caplog.text
        and "--no-cuda-graphs" in caplog.text
    )
    assert not graphs.graphs  # nothing half-captured kept
    ok = EagerGraphs(None, 2, 4, torch.device("cpu"))
    assert captured_or_none(ok) is ok


def test_staging_pads_up_to_the_bucket():
    graphs = DecodeGraphs(None, 4, 6, torch.device("cpu"))
    assert graphs.buckets == [1, 2, 4]
    b = graphs.stage([7, 8, 9], [4, 10, 2], [36, 91, 18], [5, 11, 3], [[2], [5, 3], [1]], [2, 0, 1])
    assert b == 4
    assert graphs.slot_mapping.tolist() == [36, 91, 18, -1]  # padding: no slot, kv_store skips it
    assert graphs.seq_lens.tolist() == [5, 11, 3, 1]
    assert graphs.state_indices.tolist() == [2, 0, 1, -1]  # padding: no recurrent state
    assert graphs.block_table.tolist() == [
        [2, 0, 0, 0, 0, 0],
        [5, 3, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],
        [0] * 6,
    ]
    graphs.stage([1], [0], [0], [1], [[4]])  # a smaller step leaves no stale row in its own bucket
    assert graphs.block_table[:1].tolist() == [[4, 0, 0, 0, 0, 0]]
    assert graphs.state_indices[:1].tolist() == [-1]  # a model without recurrent state


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_5"])
def test_cuda_graph_decode_equals_eager(tmp_path, arch):
    path = save_tiny(tiny_hf_model(arch, tied=False, seed=12), tmp_path)
    options = dict(device="cuda", dtype="float32", max_concurrency=3, enable_prefix_caching=False)
    eager = LLM(path, cuda_graphs=False, **options)
    assert eager.runner.graphs is None
    graphed = LLM(path, **options)
    assert graphed.runner.graphs is not None and sorted(graphed.runner.graphs.graphs) == [
        (1, 1),
        (2, 1),
        (3, 1),
    ]
    want = eager.generate(prompt_token_ids=_prompts(), sampling_params=PARAMS)
    got = graphed.generate(prompt_token_ids=_prompts(), sampling_params=PARAMS)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids


@pytest.mark.gpu
def test_forced_naive_twins_decode_without_graphs(tmp_path, kernel_backend, caplog):
    """NINFER_KERNELS=naive on a GPU: the twins read lengths on the host, so no capture is tried (none
    fails, nothing is logged as a failure) and decoding gives the Triton path's tokens."""
    path = save_tiny(tiny_hf_model("qwen3_5", tied=False, seed=12), tmp_path)
    options = dict(device="cuda", dtype="float32", max_concurrency=3)
    kernel_backend("naive")
    naive = LLM(path, **options)
    assert naive.runner.graphs is None and "capture failed" not in caplog.text
    want = naive.generate(prompt_token_ids=_prompts(), sampling_params=PARAMS)
    kernel_backend("triton")
    got = LLM(path, **options).generate(prompt_token_ids=_prompts(), sampling_params=PARAMS)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
