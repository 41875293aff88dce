"""return_progress (llama-server's): a request whose prompt runs in several chunks gets an output after each
chunk that gave no token, saying how far the prompt has come, never less than before (a preempted prompt is
computed again); others never see one."""

from __future__ import annotations

from engine import LLM, SamplingParams

PROMPT = list(range(100, 200))  # 100 tokens: 4 chunks of 32


def _run(llm: LLM, prompts: dict[str, tuple[list[int], bool]]) -> dict[str, list]:
    for rid, (ids, progress) in prompts.items():
        llm.add_request(ids, SamplingParams(max_tokens=2, temperature=0, return_progress=progress), rid)
    seen: dict[str, list] = {rid: [] for rid in prompts}
    while llm.has_unfinished_requests():
        for out, delta in llm.step():
            seen[out.request_id].append((out.prompt_progress, len(out.token_ids), delta))
    return seen


def test_each_chunk_without_a_token_says_how_far_the_prompt_has_come():
    llm = LLM(prefill_chunk=32, max_concurrency=2)
    seen = _run(llm, {"asked": (PROMPT, True), "not": (PROMPT[:60] + [7], False)})
    progress = [p for p, _, _ in seen["asked"] if p is not None]
    assert progress == [(100, 0, 32), (100, 0, 64), (100, 0, 96)]
    assert all(n == 0 and delta == "" for p, n, delta in seen["asked"] if p is not None)
    assert [n for p, n, _ in seen["asked"] if p is None] == [1, 2]  # then the tokens as ever
    assert all(p is None for p, _, _ in seen["not"])


def test_a_cached_prefix_is_counted_and_a_prompt_of_one_chunk_has_none():
    llm = LLM(prefill_chunk=32, max_concurrency=2)
    _run(llm, {"first": (PROMPT, False)})
    again = _run(llm, {"again": (PROMPT + list(range(300, 340)), True)})["again"]
    progress = [p for p, _, _ in again if p is not None]
    # the first 96 tokens are cached pages (16-token pages, the last one partial is recomputed)
    assert progress and all(total == 140 and cache == 96 for total, cache, _ in progress)
    assert [processed for _, _, processed in progress] == [128]
    short = _run(llm, {"short": (list(range(400, 420)), True)})["short"]
    assert all(p is None for p, _, _ in short)


def test_a_prompt_preempted_midway_never_says_less_than_before():
    # a 112-token pool: the decoding request outgrows it while the other's prompt runs, which is preempted
    # mid-prompt (its pages freed) and computed again later
    llm = LLM(prefill_chunk=32, max_concurrency=2, kv_capacity=112, max_context=112)
    llm.add_request(list(range(100, 140)), SamplingParams(max_tokens=60, temperature=0, ignore_eos=True), "a")
    params = SamplingParams(max_tokens=4, temperature=0, return_progress=True, ignore_eos=True)
    llm.add_request(list(range(200, 286)), params, "b")
    said = []
    while llm.has_unfinished_requests():
        said += [
            out.prompt_progress[2] for out, _ in llm.step() if out.prompt_progress and out.request_id == "b"
        ]
    assert llm.scheduler.num_preemptions > 0
    assert said == sorted(set(said)) and said[-1] < 86, said  # strictly more each time (it was 55 -> 32)
