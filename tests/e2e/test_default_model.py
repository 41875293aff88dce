"""The embedded default model (SmolLM2-135M-Instruct, GGUF Q4_1): parity with transformers, and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.loader import default_model_path

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three primary colors."},
    ],
    [
        {"role": "user", "content": "Write a haiku about the sea."},
        {"role": "assistant", "content": "Waves fold into foam"},
        {"role": "user", "content": "Now one about mountains."},
    ],
]


@pytest.fixture(scope="module")
def ours():
    """Dense fp32 weights: the same math as transformers' dequantized GGUF."""
    return LLM(device="cpu", dtype="float32", weight_quant="none")


@pytest.fixture(scope="module")
def quantized():
    """The default: int4 layers (exactly the file's Q4_1 blocks, bf16 scales), int8 head (the Q8_0 embedding)."""
    return LLM(device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # run the full 32 steps, as ours does with ignore_eos
    return tok, model.eval()


@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_greedy_matches_transformers_on_gguf(ours, reference, chat):
    tok, model = reference
    messages = CHATS[chat]
    ref_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    ids = ours.tokenizer.encode_chat(messages)
    assert ids == list(ref_ids)
    ref = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=0)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out = ours.generate(prompt_token_ids=ids, sampling_params=params)[0]
    assert out.token_ids == ref[0, len(ids) :].tolist()


@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_quantized_weights_stay_close_to_dense(ours, quantized, chat):
    """Teacher-forced on the dense model's greedy path: the quantized model's logprob of each dense token
    deviates by at most 0.08 nats on average and 0.5 at worst (measured: ~0.035 mean, ~0.27 max)."""
    ids = ours.tokenizer.encode_chat(CHATS[chat])
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, logprobs=0)
    dense = ours.generate(prompt_token_ids=ids, sampling_params=params)[0]
    deviations = []
    for k, token in enumerate(dense.token_ids):
        step = SamplingParams(max_tokens=1, temperature=0.0, logprobs=20)
        out = quantized.generate(prompt_token_ids=ids + dense.token_ids[:k], sampling_params=step)[0]
        assert token in out.logprobs[0], f"dense token {k} fell out of the quantized top 20"
        deviations.append(abs(out.logprobs[0][token] - dense.logprobs[k][token]))
    assert sum(deviations) / len(deviations) < 0.08 and max(deviations) < 0.5


@pytest.mark.parametrize("model", ["ours", "quantized"])
def test_offline_chat_answers_paris(model, request):
    out = request.getfixturevalue(model).chat(CHATS[0], SamplingParams(max_tokens=32, temperature=0.0))
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


def _ninfer(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ninfer_cli.main", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300, env=env)


def test_cli_one_shot_prompt():
    proc = _ninfer("chat", "--prompt", "What is the capital of France?")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_cli_repl_reads_lines_and_keeps_the_conversation():
    proc = _ninfer(
        "chat", stdin="What is the capital of France?\n/reset\nWhat is the capital of France?\n/exit\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("Paris") == 2
    assert "conversation cleared" in proc.stderr
