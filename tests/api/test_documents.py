"""Files that requests carry inline (engine/api/documents.py): a PDF's pages reach the model as their text
(Anthropic document blocks, in a message or a tool result as Claude Code's Read sends them; OpenAI file
parts; Responses input_file), a page without text is named so, a text file as it is; damaged, locked, too
long or by-reference files are refused in a sentence."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest
from pdf_files import pdf_bytes
from scripted_engine import ScriptedEngine
from server import RunningServer

from engine.api import documents
from engine.api.documents import file_parts
from engine.api.errors import ApiError

PAGES = ["The launch code is 4471.", "", "Signed (in ink) by the captain."]


def file_text(data: str, where: str, media_type: str | None = None) -> str:
    """A file's parts without a place for images: text alone."""
    return "".join(file_parts(data, where, media_type))


PDF = base64.b64encode(pdf_bytes(PAGES)).decode()
READ = (
    "[page 1]\nThe launch code is 4471.\n\n[page 2]\n" + documents.NO_TEXT + "\n\n[page 3]\n"
    "Signed (in ink) by the captain."
)


def test_a_pdfs_pages_are_read_as_text_and_kept_for_the_next_turn(monkeypatch):
    assert file_text(PDF, "doc", "application/pdf") == READ
    assert file_text(f"data:application/pdf;base64,{PDF}", "doc") == READ
    import pypdf

    monkeypatch.setattr(pypdf, "PdfReader", None)  # read again: from the kept texts
    assert file_text(PDF, "doc") == READ


def test_a_text_file_is_read_as_it_is():
    data = base64.b64encode("naïve café\n".encode()).decode()
    assert file_text(data, "doc", "text/markdown") == "naïve café\n"
    assert file_text(f"data:application/json;base64,{data}", "doc") == "naïve café\n"
    assert file_text(data, "doc", "video/mp2t") == "naïve café\n"  # a TypeScript file's guessed type
    assert file_text(data, "doc") == "naïve café\n"  # no type at all


@pytest.mark.parametrize(
    ("data", "media_type", "message"),
    [
        ("not base64!", "application/pdf", "doc holds no valid base64 data"),
        (base64.b64encode(b"%PDF-1.4 nothing more").decode(), None, "doc is not a readable PDF ("),
        (base64.b64encode(b"GIF89a....").decode(), "application/pdf", "doc is not a PDF: its data does not"),
        (
            base64.b64encode(b"\x89PNG....").decode(),
            "image/png",
            "doc is a image/png; this server reads PDFs",
        ),
        (base64.b64encode(b"\xff\xfe").decode(), "text/plain", "doc is text/plain but not UTF-8 text"),
    ],
)
def test_files_it_cannot_read_are_refused_in_a_sentence(data, media_type, message):
    with pytest.raises(ApiError) as e:
        file_text(data, "doc", media_type)
    assert e.value.status == 400 and e.value.message.startswith(message) and "\n" not in e.value.message


def test_a_pdf_past_the_page_limit_is_refused(monkeypatch):
    monkeypatch.setattr(documents, "MAX_PAGES", 2)
    other = base64.b64encode(pdf_bytes(["a", "b", "c"])).decode()
    with pytest.raises(ApiError, match="doc is a PDF of 3 pages; this server reads at most 2"):
        file_text(other, "doc")


def test_claude_codes_read_of_a_pdf_reaches_the_model_as_text():
    engine = ScriptedEngine(["It is 4471."] * 3)
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}
    with RunningServer(engine) as s:
        claude = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        messages = [
            {"role": "user", "content": "What is the launch code in plan.pdf?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [pdf]}]},
        ]
        reply = claude.messages.create(model="m", max_tokens=20, messages=messages)
        assert reply.content[0].text == "It is 4471."
        assert READ in engine.prompts[0]
        titled = {**pdf, "title": "plan.pdf"}
        claude.messages.create(
            model="m",
            max_tokens=20,
            messages=[{"role": "user", "content": [titled, {"type": "text", "text": "?"}]}],
        )
        assert "Title: plan.pdf\n" + READ in engine.prompts[1]
        by_url = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
        with pytest.raises(anthropic.BadRequestError, match="is a document by URL; this server fetches"):
            claude.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": [by_url]}])


def test_openai_file_parts_and_responses_input_files_reach_the_model_as_text():
    engine = ScriptedEngine(["4471."] * 3)
    with RunningServer(engine) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        part = {
            "type": "file",
            "file": {"filename": "plan.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
        }
        question = {"type": "text", "text": "The code?"}
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": [part, question]}])
        assert "File: plan.pdf\n" + READ in engine.prompts[0]
        item = {"type": "input_file", "filename": "plan.pdf", "file_data": PDF}
        client.responses.create(
            model="m",
            input=[{"role": "user", "content": [item, {"type": "input_text", "text": "The code?"}]}],
        )
        assert "File: plan.pdf\n" + READ in engine.prompts[1]
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[0\] names a file by id"):
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}],
            )
        with pytest.raises(openai.BadRequestError, match=r"input\[0\].content\[0\] names a file by URL"):
            client.responses.create(
                model="m",
                input=[{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]}],
            )
        assert len(engine.prompts) == 2  # nothing ran for the refused ones


def test_a_bodys_pdfs_are_read_in_a_thread_before_the_prompt_is_rendered(monkeypatch):
    import asyncio
    import threading

    from engine.api.documents import read_ahead

    other = base64.b64encode(pdf_bytes(["Read ahead."])).decode()
    threads = []
    real = documents.pdf_pages

    def spy(raw, where, scans=False):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(raw, where, scans)

    monkeypatch.setattr(documents, "pdf_pages", spy)
    body = {
        "messages": [
            {"content": [{"type": "document", "source": {"type": "base64", "data": other}}]},
            {
                "content": [
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQK"}}
                ]
            },
        ]
    }
    asyncio.run(read_ahead(body))  # the damaged one is left for the route to refuse
    assert threads == [False, False]
    monkeypatch.setattr(documents, "pdf_pages", real)
    import pypdf

    monkeypatch.setattr(pypdf, "PdfReader", None)
    assert file_text(other, "doc") == "[page 1]\nRead ahead."  # kept


def jpeg(height: int, width: int, seed: int) -> bytes:
    """A JPEG file of random pixels."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def test_a_textless_pages_images_are_kept_as_the_file_holds_them():
    """pdf_pages: a page without text keeps its images large enough to be its content (a scan: the JPEG's
    own bytes, not written again); an icon-sized one is not a scan."""
    scan, icon = jpeg(96, 72, 96), jpeg(16, 16, 16)
    raw = pdf_bytes(["Page one.", scan, icon, ""])
    # read for a server without the tower: no images read (the kept pages then serve those requests)
    assert [p.images for p in documents.pdf_pages(raw, "doc")] == [(), (), (), ()]
    pages = documents.pdf_pages(raw, "doc", scans=True)  # read again, images and all
    assert [p.text for p in pages] == ["Page one.", "", "", ""]
    assert [p.images for p in pages] == [(), (scan,), (), ()]
    assert documents.pdf_pages(raw, "doc") is pages  # (kept)
    # without a place for images (file_text; a server without --vision) the scanned page has the note
    text = file_text(base64.b64encode(pdf_bytes(["Page one.", scan])).decode(), "doc")
    assert text == "[page 1]\nPage one.\n\n[page 2]\n" + documents.NO_TEXT


def test_a_text_pages_figures_are_kept_but_not_what_every_page_draws():
    """pdf_pages with images: a page with text keeps its figures (FIGURE_MIN_SIDE a side and more, largest
    first), not an icon, nor an image several pages draw (a logo); a textless page keeps its scan, even where
    another page draws it too; without images, no page keeps any."""
    chart, plot, icon, logo = jpeg(96, 128, 1), jpeg(64, 80, 2), jpeg(40, 200, 3), jpeg(80, 160, 4)
    graph = jpeg(70, 70, 5)
    raw = pdf_bytes(
        [("Results.", [logo, plot, icon, chart]), ("Discussion.", [logo]), logo, ("Appendix.", [graph])]
    )
    assert [p.images for p in documents.pdf_pages(raw, "doc")] == [(), (), (), ()]
    pages = documents.pdf_pages(raw, "doc", scans=True)
    assert [p.text for p in pages] == ["Results.", "Discussion.", "", "Appendix."]
    assert [p.images for p in pages] == [(chart, plot), (), (logo,), (graph,)]
