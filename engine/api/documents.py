"""Files that requests carry inline, read as the text the model gets: PDFs (Anthropic `document` blocks with a
base64 PDF, as Claude Code's Read of a .pdf sends them; OpenAI `file` parts and Responses `input_file`s
with `file_data`) page by page, and plain-text files as they are.

A PDF's text layer is read with pypdf. A page without one (a scanned image, a drawing): on a server that
takes images (--vision), the page's own images go to the model as images, so a scanned page is read as a
photo of it would be; elsewhere, or where the page holds no image, it is named as such in the text, so an
agent whose history holds such a file goes on. On such a server a page with text also brings its figures
(its images of FIGURE_MIN_SIDE pixels a side or more, but those drawn on several pages: a logo, a
letterhead, a watermark), after its text. An agent sends the same file again with every turn, so the
latest files' pages are kept by the file's digest. Files by id or URL are not taken (nothing is
stored or fetched here). Reading a long PDF takes seconds, so `read_ahead` reads a body's PDFs in a thread
before the route renders the prompt (which then finds their texts kept): the event loop, and every other
stream, goes on meanwhile."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import io
import logging
import mimetypes
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.api.errors import ApiError
from engine.api.images import MessageImages

MAX_PAGES = 600  # as the Anthropic API's limit on a request's PDF pages
KEPT = 16  # the latest files' texts kept (an agent's history resends them every turn)
NO_TEXT = "(this page has no text: a scanned image or a drawing, which this server does not read)"
SCAN_MIN_SIDE = 32  # pixels: a textless page's smaller images (rules, spacers, icons) are not its scan
FIGURE_MIN_SIDE = 64  # pixels: a text page's smaller images (icons, bullets, a formula set as an image) are
# not figures
SCANS_PER_PAGE = 4  # a page's largest images at most (a scanner may cut a page into strips)
# a scan's pixels at most (1,600 tokens at Qwen's 32-pixel tiles, as the Anthropic API sizes a page's
# image): a 300 dpi page would take ten times that at the checkpoint's own limit
SCAN_MAX_PIXELS = 1280 * 1280


@dataclass(frozen=True)
class PdfPage:
    text: str  # its text layer, stripped ("" for none)
    # its images (PNG / JPEG files), largest first: a textless page's scans, a text page's figures; read
    # only for a server that takes images (pdf_pages' `scans`)
    images: tuple[bytes, ...] = ()


# the latest files' pages by digest, and whether their scans were read
_texts: OrderedDict[bytes, tuple[tuple[PdfPage, ...], bool]] = OrderedDict()
_lock = threading.Lock()  # read_ahead's thread and the event loop
PDF_BASE64 = "JVBERi0"  # "%PDF-", base64-encoded: how an inline PDF's data begins


async def read_ahead(body: Any, scans: bool = False) -> None:
    """Read the PDFs a request body holds inline (any `data` / `file_data` string that is a base64 PDF) in a
    thread, so that rendering the prompt finds their texts kept. A file that cannot be read is left for the
    route, which names it in its refusal."""
    found: list[str] = []
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("data", "file_data") and isinstance(value, str):
                    data = value.partition(",")[2] if value.startswith("data:") else value
                    if data.startswith(PDF_BASE64):
                        found.append(data)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(n for n in node if isinstance(n, (dict, list)))
    for data in found:
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            continue
        with contextlib.suppress(ApiError):
            await asyncio.to_thread(pdf_pages, raw, "", scans)


TEXT_TYPES = ("application/json", "application/xml", "application/x-yaml", "application/yaml")


def file_parts(
    data: str, where: str, media_type: str | None = None, images: MessageImages | None = None
) -> list[str | dict[str, str]]:
    """The parts the model reads of a file given as base64 (or as a `data:` URL, whose media type then
    counts): a PDF's pages, or a text file's contents; refused in a sentence when it is neither, or
    unreadable. With `images` that take a PDF's scans (MessageImages.read_scans), a textless page's images
    come among the text, each kept in `images`; else text alone."""
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        media_type = head[5:].split(";")[0] or media_type
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where} holds no valid base64 data") from None
    if raw.lstrip()[:5] == b"%PDF-":
        scans = images is not None and images.read_scans
        return _pdf_parts(pdf_pages(raw, where, scans), where, images)
    if media_type == "application/pdf":
        raise ApiError(400, f"{where} is not a PDF: its data does not begin with %PDF-")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:  # a text file, whatever its name says (a .ts is no video)
        return [text]
    if media_type is not None and (media_type.startswith("text/") or media_type in TEXT_TYPES):
        raise ApiError(400, f"{where} is {media_type} but not UTF-8 text")
    raise ApiError(
        400,
        f"{where} is a {media_type or 'file of unknown type'}; this server reads PDFs and text files (send "
        "other files' text)",
    )


def _pdf_parts(
    pages: tuple[PdfPage, ...], where: str, images: MessageImages | None
) -> list[str | dict[str, str]]:
    """The pages as message parts: "[page N]", its text and its figures; a textless page's scans as images
    where `images` takes them, else the note that it has no text."""
    parts: list[str | dict[str, str]] = []
    takes = images is not None and images.read_scans
    for i, page in enumerate(pages, start=1):
        parts.append(("\n\n" if i > 1 else "") + f"[page {i}]\n")
        if page.text or not (page.images and takes):
            parts.append(page.text or NO_TEXT)
        if page.images and takes:
            parts.extend(["\n"] if page.text else [])
            parts.extend(images.add(image, f"{where} (page {i})", SCAN_MAX_PIXELS) for image in page.images)
    return parts


def pdf_pages(raw: bytes, where: str, scans: bool = False) -> tuple[PdfPage, ...]:
    """A PDF's pages: each one's text, and with `scans` a textless page's images (kept by the file's
    digest; a scanned file read without them is read again for a request that takes them)."""
    digest = hashlib.sha256(raw).digest()
    with _lock:
        if digest in _texts and (_texts[digest][1] or not scans):
            _texts.move_to_end(digest)
            return _texts[digest][0]
    import pypdf  # (read on the first PDF: the server starts without it)

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a damaged file's repairs are not the log's business
    try:
        reader = pypdf.PdfReader(io.BytesIO(raw), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise ApiError(400, f"{where} is a PDF locked with a password; send it unlocked")
        count = len(reader.pages)
        if count > MAX_PAGES:
            raise ApiError(400, f"{where} is a PDF of {count} pages; this server reads at most {MAX_PAGES}")
        texts = [(page.extract_text() or "").strip() for page in reader.pages]
    except ApiError:
        raise
    except Exception as e:  # noqa: BLE001 - pypdf's errors on damaged files are of many types
        raise ApiError(400, f"{where} is not a readable PDF ({type(e).__name__}: {e})") from None
    shared = _shared_images(reader.pages) if scans else set()
    pages = tuple(
        PdfPage(text, (_page_images(page, shared) if text else _page_images(page)) if scans else ())
        for text, page in zip(texts, reader.pages, strict=True)
    )
    with _lock:
        _texts[digest] = pages, scans
        while len(_texts) > KEPT:
            _texts.popitem(last=False)
    return pages


def _page_images(page, shared: set[int] | None = None) -> tuple[bytes, ...]:
    """A page's images large enough to be its content, largest first, as image files: a textless page's
    (`shared` None: its scans, SCAN_MIN_SIDE a side), or a text page's figures (FIGURE_MIN_SIDE a side, and
    none of the `shared` objects); none where pypdf cannot decode them (a JBIG2 scan without its decoder:
    a textless page is then said to have no text). Sizes come from the images' dictionaries: a page's
    images are decoded only when chosen, and a JPEG not at all."""
    try:
        xobjects = _xobjects(page)
        keys = list(page.images.keys())  # (iterating page.images itself decodes every image)
        if shared:
            keys = [key for key in keys if _object_number(xobjects, key) not in shared]
        held = {key: xobjects[key].get_object() for key in keys if isinstance(key, str) and key in xobjects}
        sizes = {key: _size(page, key, held.get(key)) for key in keys}
        least = SCAN_MIN_SIDE if shared is None else FIGURE_MIN_SIDE
        largest = sorted(sizes, key=lambda key: -sizes[key][0] * sizes[key][1])[:SCANS_PER_PAGE]
        return tuple(_image_file(page, key, held.get(key)) for key in largest if min(sizes[key]) >= least)
    except Exception:  # noqa: BLE001 - a filter pypdf lacks, a damaged stream: the page keeps its note
        return ()


def _shared_images(pages) -> set[int]:
    """The numbers of the image objects that more than one page draws (a logo, a letterhead, a watermark:
    not a text page's figures)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for page in pages:
        try:
            xobjects = _xobjects(page)
            numbers = {_object_number(xobjects, key) for key in xobjects}
        except Exception:  # noqa: BLE001 - a damaged page: its images are read (or not) by _page_images
            continue
        numbers.discard(None)
        shared |= seen & numbers
        seen |= numbers
    return shared


def _xobjects(page):
    """The page's own XObject dictionary (its images and forms by name; {} for none)."""
    resources = page.get("/Resources")
    xobjects = resources.get_object().get("/XObject") if resources is not None else None
    return xobjects.get_object() if xobjects is not None else {}


def _object_number(xobjects, key) -> int | None:
    """The object number an XObject name refers to (None: held in place, or not one of the page's own)."""
    if not isinstance(key, str) or key not in xobjects:
        return None
    ref = xobjects.raw_get(key)
    return getattr(ref, "idnum", None)


def _size(page, key, held) -> tuple[int, int]:
    """An image's (width, height): from its dictionary where it has one, else decoded (an inline image, one
    inside a form)."""
    if held is not None and "/Width" in held and "/Height" in held:
        return int(held["/Width"]), int(held["/Height"])
    return page.images[key].image.size


def _image_file(page, key, held) -> bytes:
    """A PDF image as an image file: a JPEG as the file holds it (pypdf's own writes it again, a second
    lossy pass over a scan's text), one with a mask, a decode map or another colour space, and every other
    encoding, as pypdf writes it (PNG for those: lossless)."""
    if (
        held is not None
        and held.get("/Filter") == "/DCTDecode"
        and held.get("/ColorSpace") in ("/DeviceRGB", "/DeviceGray")
        and "/SMask" not in held
        and "/Decode" not in held
    ):
        return held.get_data()
    return page.images[key].data


def openai_file_parts(
    file: object, where: str, images: MessageImages | None = None
) -> list[str | dict[str, str]]:
    """An OpenAI `file` part's `file` ({"file_data": base64 or a data: URL, "filename": ...}) as the parts
    the model reads: the file's name, then its text (file_parts); files by id or URL are refused in a
    sentence."""
    if not isinstance(file, dict):
        raise ApiError(400, f"{where}.file must be an object with 'file_data' (base64 or a data: URL)")
    data, name = file.get("file_data"), file.get("filename")
    if data is None:
        by = "id" if file.get("file_id") is not None else "URL" if file.get("file_url") is not None else None
        if by is not None:
            raise ApiError(
                400,
                f"{where} names a file by {by}; this server fetches and keeps no files: send it as file_data "
                "(base64 or a data: URL)",
            )
    if not isinstance(data, str):
        raise ApiError(400, f"{where}.file needs 'file_data' (base64 or a data: URL) as a string")
    media_type = mimetypes.guess_type(name)[0] if isinstance(name, str) else None
    head = [f"File: {name}\n"] if isinstance(name, str) else []
    return [*head, *file_parts(data, where, media_type, images), "\n\n"]
