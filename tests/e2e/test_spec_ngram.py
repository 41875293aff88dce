"""N-gram speculative decoding on the embedded default model: a reply that copies its prompt is drafted
from it, many drafts are accepted, and the output is what plain decoding gives."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

CODE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
"""
MESSAGES = [{"role": "user", "content": f"Repeat this code exactly, with nothing else:\n\n{CODE}"}]


@pytest.fixture(scope="module")
def plain():
    return LLM(max_concurrency=1)


def test_copying_reply_is_drafted_and_unchanged(plain):
    params = SamplingParams(max_tokens=48, temperature=0.0)
    reference = plain.chat(MESSAGES, params)
    spec = LLM(max_concurrency=1, spec="ngram", draft_tokens=4)
    out = spec.chat(MESSAGES, params)
    assert out.token_ids == reference.token_ids
    assert "return width * height" in out.text
    assert out.num_draft_tokens > 0
    # (46% here: the copy starts after a preamble, and "def" is followed by two different names)
    assert out.num_accepted_tokens / out.num_draft_tokens > 0.3
    assert spec.scheduler.num_accepted_tokens == out.num_accepted_tokens


def test_stop_string_inside_an_accepted_run(plain):
    params = SamplingParams(max_tokens=48, temperature=0.0, stop=["perimeter"])
    reference = plain.chat(MESSAGES, params)
    out = LLM(max_concurrency=1, spec="ngram", draft_tokens=4).chat(MESSAGES, params)
    assert (out.text, out.token_ids, out.finish_reason) == (
        reference.text,
        reference.token_ids,
        reference.finish_reason,
    )
    assert out.finish_reason == "stop" and "perimeter" not in out.text
