"""Small PDF files for the document tests, written here byte by byte: one page per item. A text (an empty
text: a page with nothing written on it) in Helvetica; a JPEG file (bytes: a scanned page, the image drawn
over the page and no text); or (text, [JPEG files]): a page of text with figures drawn below it. The same
JPEG bytes on several pages are one image object, which each page draws (a logo in every page's header)."""

from __future__ import annotations

import io

Page = str | bytes | tuple[str, list[bytes]]


def pdf_bytes(pages: list[Page]) -> bytes:
    bodies: dict[int, bytes] = {1: b"<< /Type /Catalog /Pages 2 0 R >>", 3: _FONT}
    images: dict[bytes, int] = {}  # a JPEG file -> its object's number
    kids = []
    numbers = iter(range(4, 1 << 20))
    for page in pages:
        text, figures = (
            (page, []) if isinstance(page, str) else ("", [page]) if isinstance(page, bytes) else page
        )
        number, contents = next(numbers), next(numbers)
        kids.append(number)
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET\n".encode() if text else b""
        names = []
        for i, jpeg in enumerate(figures, start=1):
            if jpeg not in images:
                images[jpeg] = next(numbers)
                bodies[images[jpeg]] = _image(jpeg)
            names.append(f"/Im{i} {images[jpeg]} 0 R")
            # a scan covers the page; a figure takes a band below the text
            place = b"612 0 0 792 0 0" if isinstance(page, bytes) else b"300 0 0 200 72 %d" % (480 - 210 * i)
            stream += b"q %s cm /Im%d Do Q\n" % (place, i)
        resources = "/Font << /F1 3 0 R >>" + (f" /XObject << {' '.join(names)} >>" if names else "")
        bodies[number] = (
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {contents} 0 R "
            f"/Resources << {resources} >> >>".encode()
        )
        bodies[contents] = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream)
    bodies[2] = f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number in range(1, max(bodies) + 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, bodies[number])
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(offsets) + 1, xref)
    return bytes(out)


_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def _image(jpeg: bytes) -> bytes:
    from PIL import Image

    width, height = Image.open(io.BytesIO(jpeg)).size
    return (
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB /BitsPerComponent 8 "
        b"/Filter /DCTDecode /Length %d >>\nstream\n%s\nendstream" % (width, height, len(jpeg), jpeg)
    )
