"""Small PDF files for the document tests, written here byte by byte: one page per text (an empty text: a
page with nothing written on it), in Helvetica, or per JPEG file (bytes: a scanned page, the image drawn
over the page and no text)."""

from __future__ import annotations

import io


def pdf_bytes(pages: list[str | bytes]) -> bytes:
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b""]  # the page tree is filled in below
    kids = []
    font = 3 + 3 * len(pages)
    for page in pages:
        kids.append(len(objects) + 1)
        if isinstance(page, bytes):  # a scan: the JPEG as the page's one image
            from PIL import Image

            width, height = Image.open(io.BytesIO(page)).size
            stream = b"q 612 0 0 792 0 0 cm /Im1 Do Q"
            resources = f"/XObject << /Im1 {len(objects) + 3} 0 R >>"
        else:
            escaped = page.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode() if page else b""
            resources = f"/Font << /F1 {font} 0 R >>"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects) + 2} 0 R "
            f"/Resources << {resources} >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
        if isinstance(page, bytes):
            objects.append(
                b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
                b"/BitsPerComponent 8 /Filter /DCTDecode /Length %d >>\nstream\n%s\nendstream"
                % (width, height, len(page), page)
            )
        else:
            objects.append(b"null")  # (numbering alike: three objects a page)
    objects[1] = (
        f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()
    )
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)
