"""`ninfer chat --lora PATH`: the replies run with the adapter (an adapter of zeros: as without one)."""

from __future__ import annotations

import pytest
from conftest import write_lora_adapter
from typer.testing import CliRunner

from engine.models.loader import open_source
from ninfer_cli.main import app

pytestmark = pytest.mark.slow
ASK = ["chat", "-p", "What is the capital of France?", "--max-tokens", "12", "--temperature", "0"]


def test_chat_replies_run_with_the_adapter(tmp_path):
    config = open_source(None).config
    hidden = config.hidden_size
    shapes = {"self_attn.q_proj": (hidden, hidden), "mlp.down_proj": (config.intermediate_size, hidden)}
    loud = write_lora_adapter(tmp_path / "loud", shapes, config.num_hidden_layers, scale=0.5)
    zero = write_lora_adapter(tmp_path / "zero", shapes, config.num_hidden_layers, scale=0)
    runner = CliRunner()
    replies = {}
    for name, extra in (("base", []), ("loud", ["--lora", str(loud)]), ("zero", ["--lora", str(zero)])):
        result = runner.invoke(app, ASK + extra)
        assert result.exit_code == 0, result.output
        replies[name] = result.stdout
    assert "Paris" in replies["base"]
    assert replies["loud"] != replies["base"] and replies["zero"] == replies["base"]


def test_chat_lora_refusals(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, [*ASK, "--lora", str(tmp_path), "--url", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "with --url, ask for the server's adapter by its name" in result.output
    result = runner.invoke(app, [*ASK, "--lora", str(tmp_path / "none")])
    assert result.exit_code == 2 and "is not a folder" in result.output
