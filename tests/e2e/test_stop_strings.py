"""Stop strings on the real tokenizer: the text is cut before the stop string, never streamed past it."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm():
    return LLM()


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_stop_string_cuts_text(llm):
    full = llm.chat(MESSAGES, SamplingParams(max_tokens=32, temperature=0.0)).text
    assert "Paris" in full
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=32, temperature=0.0, stop=["Paris"]))
    assert out.finish_reason == "stop"
    assert out.text == full[: full.index("Paris")]


def test_streamed_deltas_never_contain_the_stop_string(llm):
    params = SamplingParams(max_tokens=32, temperature=0.0, stop=["of France is"])
    deltas = [d for d, _ in llm.stream_chat(MESSAGES, params)]
    assert "".join(deltas) == "The capital "
    assert not llm.has_unfinished_requests()


def test_abandoned_stream_frees_its_request(llm):
    stream = llm.stream_chat(MESSAGES, SamplingParams(max_tokens=32, temperature=0.0))
    next(stream)
    stream.close()
    assert not llm.has_unfinished_requests()
    assert llm.scheduler.block_pool.num_free_blocks == llm.scheduler.block_pool.num_blocks
