"""`ninfer chat --vision`: a picture with --prompt --image, or attached in the conversation with /image;
what goes wrong is said in one line and the session goes on."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import save_tiny_vl_chat
from typer.testing import CliRunner

from engine import LLM, SamplingParams
from ninfer_cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def vl_dir(default_tokenizer, tmp_path_factory):
    return save_tiny_vl_chat(tmp_path_factory.mktemp("vl_chat"), default_tokenizer)


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("pictures") / "cat.png"
    pixels = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def _chat(vl_dir, *args, stdin: str | None = None):
    result = runner.invoke(app, ["chat", str(vl_dir), "--max-tokens", "6", *args], input=stdin)
    return result.exit_code, result.output


def test_one_shot_with_an_image_answers_as_the_offline_api(vl_dir, picture):
    code, out = _chat(vl_dir, "--vision", "--prompt", "What is this?", "--image", str(picture))
    assert code == 0, out
    llm = LLM(vl_dir, vision=True, max_concurrency=1)
    content = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    want = llm.chat(
        [{"role": "user", "content": content}],
        SamplingParams(max_tokens=6, temperature=0.0),
        images=[llm.image(picture.read_bytes())],
    )
    assert want.text and want.text in out
    assert len(want.prompt_token_ids) > 12  # the picture's 12 tokens are in the prompt


def test_image_command_attaches_to_the_next_message(vl_dir, picture):
    stdin = f"/image /no/such.png\n/image {picture}\nWhat is this?\nAnd now?\n/exit\n"
    code, out = _chat(vl_dir, "--vision", stdin=stdin)
    assert code == 0, out
    assert "/no/such.png is not a file" in out  # said, and the session goes on
    assert "attached (12 tokens)" in out
    assert "/image PATH attaches a picture" in out
    # the second turn sends the first turn's picture again (its placeholder is in the history)
    assert out.count("error:") == 1


def test_images_need_the_tower(vl_dir, picture):
    code, out = _chat(vl_dir, "--prompt", "What is this?", "--image", str(picture))
    assert code == 2 and "start it with --vision" in out
    code, out = _chat(vl_dir, "--vision", "--image", str(picture), stdin="/exit\n")
    assert code == 2 and "--image goes with --prompt" in out
