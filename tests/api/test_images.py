"""Images over both protocols on a server run with --vision: OpenAI image_url data URLs and Anthropic base64
image blocks (also inside a tool_result) reach the tower; usage and token counts include the image's
tokens; bad images get a 400 in the protocol's shape, naming where they were."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx2 as httpx
import numpy as np
import openai
import pytest
from conftest import save_tiny_vl_chat
from pdf_files import pdf_bytes
from server import RunningServer

from engine.api import documents
from engine.api.documents import NO_TEXT
from engine.async_llm import AsyncLLM


def png(seed: int, height: int = 48, width: int = 64) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def jpeg(seed: int, height: int = 48, width: int = 64) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def openai_parts(data: bytes, text: str = "What is in this picture?") -> list[dict]:
    url = f"data:image/png;base64,{b64(data)}"
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]


def anthropic_blocks(data: bytes, text: str = "What is in this picture?") -> list[dict]:
    source = {"type": "base64", "media_type": "image/png", "data": b64(data)}
    return [{"type": "text", "text": text}, {"type": "image", "source": source}]


@pytest.fixture(scope="module")
def vl_dir(default_tokenizer, tmp_path_factory):
    return save_tiny_vl_chat(tmp_path_factory.mktemp("vl_api"), default_tokenizer)


@pytest.fixture(scope="module")
def servers(vl_dir):
    with (
        RunningServer(AsyncLLM(vl_dir, vision=True, max_concurrency=2), model_id="vl") as vision,
        RunningServer(AsyncLLM(vl_dir, max_concurrency=2), model_id="vl") as text_only,
    ):
        yield vision, text_only


def test_openai_and_anthropic_see_the_same_picture(servers):
    server = servers[0]
    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    an = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    image = png(1)
    chat = oa.chat.completions.create(
        model="vl", messages=[{"role": "user", "content": openai_parts(image)}], max_tokens=8, temperature=0
    )
    message = an.messages.create(
        model="vl",
        messages=[{"role": "user", "content": anthropic_blocks(image)}],
        max_tokens=8,
        extra_body={"temperature": 0},
    )
    assert chat.choices[0].message.content == message.content[0].text
    # 48 x 64 pixels -> 6 x 8 patches -> 3 x 4 = 12 image tokens in place of the one placeholder
    counted = an.messages.count_tokens(
        model="vl", messages=[{"role": "user", "content": anthropic_blocks(image)}]
    )
    # the second request reads the first one's pages, image included, from the prefix cache
    assert message.usage.cache_read_input_tokens > 12
    anthropic_prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert chat.usage.prompt_tokens == anthropic_prompt == counted.input_tokens
    tokenized = httpx.post(
        f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": openai_parts(image)}]}
    ).json()
    assert tokenized["count"] == chat.usage.prompt_tokens
    text_only = httpx.post(
        f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "What is in this picture?"}]}
    ).json()
    assert tokenized["count"] == text_only["count"] + 1 + 12 + 1  # vision start, 12 image tokens, vision end
    metrics = httpx.get(f"{server.url}/metrics").text
    counted = {
        ln.split()[0]: float(ln.split()[1]) for ln in metrics.splitlines() if ln.startswith("ninfer_image")
    }
    assert counted["ninfer_images_total"] >= 2 and counted["ninfer_image_tokens_total"] >= 24


def count(client, content) -> int:
    """A user turn's input tokens, as the server counts them (Anthropic's count_tokens)."""
    return client.messages.count_tokens(
        model="vl", messages=[{"role": "user", "content": content}]
    ).input_tokens


def reply(client, content) -> str:
    """The greedy reply's text to a user turn of `content`."""
    turn = [{"role": "user", "content": content}]
    out = client.messages.create(model="vl", messages=turn, max_tokens=6, extra_body={"temperature": 0})
    return out.content[0].text


def test_a_scanned_pdf_page_reaches_a_vision_model_as_its_image(servers, monkeypatch):
    """Claude Code's Read of a scanned PDF: on a server with --vision a page without text goes to the model
    as the page's image (the JPEG as the file holds it), a page with text as its text; without the tower the
    page is named as one without text and the request runs as before."""
    vision, text_only = (anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0) for s in servers)
    scan = jpeg(7)
    pdf = {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": b64(pdf_bytes(["Code 4471.", scan])),
        },
    }
    question = {"type": "text", "text": "What does it say?"}
    pages = {"type": "text", "text": "[page 1]\nCode 4471.\n\n[page 2]\n"}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(scan)}}
    as_image = [pages, image, {"type": "text", "text": "\n\n"}, question]
    as_note = [{"type": "text", "text": pages["text"] + NO_TEXT + "\n\n"}, question]

    assert count(vision, [pdf, question]) == count(vision, as_image)
    assert reply(vision, [pdf, question]) == reply(vision, as_image)
    assert count(text_only, [pdf, question]) == count(text_only, as_note)
    assert reply(text_only, [pdf, question]) == reply(text_only, as_note)
    # OpenAI's file part alike; 12 image tokens and the tower's start and end in place of the note's
    oa = openai.OpenAI(base_url=f"{servers[0].url}/v1", api_key="none", max_retries=0)
    url = f"data:application/pdf;base64,{pdf['source']['data']}"
    part = {"type": "file", "file": {"file_data": url}}
    chat = oa.chat.completions.create(
        model="vl", messages=[{"role": "user", "content": [part, question]}], max_tokens=1
    )
    assert chat.usage.prompt_tokens == count(vision, as_image)
    note = text_only.messages.count_tokens(
        model="vl", messages=[{"role": "user", "content": [{"type": "text", "text": NO_TEXT}]}]
    ).input_tokens
    bare = text_only.messages.count_tokens(
        model="vl", messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]
    ).input_tokens
    assert count(vision, as_image) == count(text_only, as_note) - (note - bare) + 1 + 12 + 1
    # a scan is held to SCAN_MAX_PIXELS (a 300 dpi page would fill a context): at 32 x 32 pixels, the 48 x 64
    # picture is 16 x 32, two of the tiny tower's 16-pixel tiles
    monkeypatch.setattr(documents, "SCAN_MAX_PIXELS", 32 * 32)
    assert count(vision, [pdf, question]) == count(vision, as_image) - 12 + 2


def test_a_text_pages_figures_reach_a_vision_model_after_its_text(servers):
    """A PDF page with text and a figure: on a server with --vision the model reads the text, then the
    figure as an image (as though the client had sent them so); without the tower, the text alone."""
    vision, text_only = (anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0) for s in servers)
    figure = jpeg(8, 64, 80)
    data = b64(pdf_bytes([("The chart shows growth.", [figure]), "Thanks."]))
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}
    question = {"type": "text", "text": "What does the chart show?"}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(figure)}}
    as_sent = [
        {"type": "text", "text": "[page 1]\nThe chart shows growth.\n"},
        image,
        {"type": "text", "text": "\n\n[page 2]\nThanks.\n\n"},
        question,
    ]
    as_text = [
        {"type": "text", "text": "[page 1]\nThe chart shows growth.\n\n[page 2]\nThanks.\n\n"},
        question,
    ]

    assert count(vision, [pdf, question]) == count(vision, as_sent) > count(vision, as_text)
    assert reply(vision, [pdf, question]) == reply(vision, as_sent)
    assert count(text_only, [pdf, question]) == count(text_only, as_text)


def test_another_picture_changes_the_logits(servers):
    oa = openai.OpenAI(base_url=f"{servers[0].url}/v1", api_key="none", max_retries=0)
    first = []
    for seed in (2, 3):
        r = oa.chat.completions.create(
            model="vl",
            messages=[{"role": "user", "content": openai_parts(png(seed))}],
            max_tokens=1,
            temperature=0,
            logprobs=True,
        )
        first.append(r.choices[0].logprobs.content[0].logprob)
    assert first[0] != first[1]


def test_streamed_reply_with_a_tool_result_image(servers):
    """Claude-Code style: a tool returned a screenshot; streamed events arrive as usual."""
    an = anthropic.Anthropic(base_url=servers[0].url, api_key="none", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": b64(png(4, 64, 64))}
    messages = [
        {"role": "user", "content": "Take a screenshot."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "screenshot", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": source}]}
            ],
        },
    ]
    tools = [{"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}]
    greedy = {"temperature": 0}
    with an.messages.stream(
        model="vl", messages=messages, tools=tools, max_tokens=6, extra_body=greedy
    ) as stream:
        final = stream.get_final_message()
    counted = an.messages.count_tokens(model="vl", messages=messages, tools=tools)
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == counted.input_tokens
    assert final.usage.output_tokens > 0


BAD = [
    # (protocol, content, words in the one-line error)
    ("openai", [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}], "not fetched"),
    (
        "openai",
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}],
        "not valid base64",
    ),
    ("openai", [{"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}], "text/plain"),
    (
        "openai",
        [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(b'hello')}"}}],
        "not a PNG",
    ),
    (
        "anthropic",
        [{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}],
        "not fetched",
    ),
    (
        "anthropic",
        [{"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": "aGk="}}],
        "image/tiff",
    ),
    (
        "anthropic",
        [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": 7}}],
        "base64",
    ),
]


@pytest.mark.parametrize("protocol, content, words", BAD)
def test_bad_images_get_a_400_naming_where(servers, protocol, content, words):
    url = servers[0].url
    body = {"model": "vl", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{url}/v1/{'chat/completions' if protocol == 'openai' else 'messages'}", json=body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "messages[0].content[0]" in message and words in message and "\n" not in message
    ok = {"model": "vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=ok).status_code == 200  # still serving


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_server_without_vision_says_how_to_take_images(servers, protocol):
    url = servers[1].url
    content = openai_parts(png(5)) if protocol == "openai" else anthropic_blocks(png(5))
    body = {"model": "vl", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{url}/v1/{'chat/completions' if protocol == 'openai' else 'messages'}", json=body)
    assert r.status_code == 400
    assert "start it with --vision" in r.json()["error"]["message"]


def test_a_body_past_the_limit_is_413_and_says_what_to_do(servers):
    """32 MiB, the Anthropic API's own limit: an agent's history resends its screenshots every turn."""
    url = servers[1].url
    big = "data:image/png;base64," + "A" * (33 << 20)
    body = {"model": "vl", "max_tokens": 4, "messages": [{"role": "user", "content": openai_parts(b"")}]}
    body["messages"][0]["content"][1]["image_url"]["url"] = big
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 413
    assert "the limit is 33554432 (32 MiB); send fewer or smaller images" in r.json()["error"]["message"]
    ok = {"model": "vl", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=ok).status_code == 200


def test_openai_detail_low_caps_the_pixels(servers):
    """detail "low" asks for at most a 512 x 512 image's pixels; "high" and "auto" for the checkpoint's
    limit; anything else is a 400."""
    from engine.api.images import LOW_DETAIL_PIXELS, openai_image

    image = png(6)
    for detail, limit in (("low", LOW_DETAIL_PIXELS), ("high", None), ("auto", None)):
        part = openai_parts(image)[1]
        part["image_url"]["detail"] = detail
        assert openai_image(part, "messages[0].content[1]") == (image, limit)
    assert LOW_DETAIL_PIXELS == 512 * 512
    parts = openai_parts(image)
    parts[1]["image_url"]["detail"] = "tiny"
    body = {"model": "vl", "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}
    r = httpx.post(f"{servers[0].url}/v1/chat/completions", json=body)
    assert r.status_code == 400 and "detail is 'tiny'; use low, high or auto" in r.json()["error"]["message"]


def test_chat_url_sends_pictures_as_the_local_chat_takes_them(servers, vl_dir, tmp_path):
    """`ninfer chat --url ... --image`: the picture goes as a data URL and the reply is the local chat's;
    a server without --vision says so in one line."""
    from typer.testing import CliRunner

    from ninfer_cli.main import app

    picture = tmp_path / "picture.png"
    picture.write_bytes(png(7))
    # greedy both ways (over --url what the flags leave out is the server's default, which samples)
    ask = ["--prompt", "What is this?", "--image", str(picture), "--max-tokens", "6", "--temperature", "0"]
    remote = CliRunner().invoke(app, ["chat", "--url", servers[0].url, *ask])
    local = CliRunner().invoke(app, ["chat", str(vl_dir), "--vision", *ask])
    assert remote.exit_code == 0 and local.exit_code == 0, remote.output + local.output
    assert remote.output.strip() and remote.output.strip() == local.output.strip()
    refused = CliRunner().invoke(app, ["chat", "--url", servers[1].url, *ask])
    assert refused.exit_code == 2 and "the server answered 400" in refused.output
    assert "start it with --vision" in refused.output


def test_responses_api_takes_input_images(servers):
    """The Responses API's input_image (a data URL) is the chat route's image_url: the same reply and count."""
    server = servers[0]
    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    image = png(2)
    chat = oa.chat.completions.create(
        model="vl", messages=[{"role": "user", "content": openai_parts(image)}], max_tokens=8, temperature=0
    )
    parts = [
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{b64(image)}", "detail": "auto"},
    ]
    r = oa.responses.create(
        model="vl", input=[{"role": "user", "content": parts}], max_output_tokens=8, temperature=0
    )
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_the_image_example_against_a_vision_server(servers, tmp_path):
    """examples/image_client.py, as a user runs it on a picture file, over both protocols."""
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(5))
    script = Path(__file__).resolve().parents[2] / "examples" / "image_client.py"
    done = subprocess.run(
        [sys.executable, str(script), str(picture)],
        env={**os.environ, "NINFER_URL": servers[0].url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # (this tiny model's replies are random words, newlines among them)
    assert re.match(r"OpenAI: .*\(\d+ prompt tokens\)\nAnthropic: ", done.stdout, re.DOTALL), done.stdout


def test_ollama_chat_and_generate_take_base64_images(servers):
    """Ollama's `images` (base64, on a message or beside /api/generate's prompt) reach the tower as the
    OpenAI route's image parts do: the same greedy reply; /api/show says vision."""
    server = servers[0]
    image = png(1)
    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    chat = oa.chat.completions.create(
        model="vl", messages=[{"role": "user", "content": openai_parts(image)}], max_tokens=8, temperature=0
    )
    options = {"temperature": 0, "num_predict": 8}
    message = {"role": "user", "content": "What is in this picture?", "images": [b64(image)]}
    body = {"model": "vl", "messages": [message], "options": options, "stream": False}
    reply = httpx.post(f"{server.url}/api/chat", json=body, timeout=60).json()
    assert reply["message"]["content"] == chat.choices[0].message.content
    assert reply["prompt_eval_count"] == chat.usage.prompt_tokens
    body = {"model": "vl", "prompt": "What is in this picture?", "images": [b64(image)], "options": options}
    with httpx.stream("POST", f"{server.url}/api/generate", json={**body, "stream": True}, timeout=60) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "".join(line.get("response", "") for line in lines) == chat.choices[0].message.content
    assert "vision" in httpx.post(f"{server.url}/api/show", json={"model": "vl"}).json()["capabilities"]
    assert (
        "vision" not in httpx.post(f"{servers[1].url}/api/show", json={"model": "vl"}).json()["capabilities"]
    )
