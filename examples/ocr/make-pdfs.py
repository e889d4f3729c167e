#!/usr/bin/env python3
"""Writes N small PDFs of a few pages each into DIR, every page a line of
known words in large Helvetica, and DIR/expected.txt listing them
("doc-K page P: WORDS"). Plain PDF 1.4 written by hand: no library needed.

usage: make-pdfs.py DIR [N] [PAGES]
"""
import os
import sys

WORDS = ["harbour", "lantern", "meadow", "copper", "violet", "granite",
         "orchard", "thunder", "pebble", "saffron", "willow", "compass"]


def page_words(doc, page):
    return " ".join(WORDS[(doc * 5 + page * 3 + k) % len(WORDS)] for k in range(3)).upper()


def pdf(pages):
    objs = []

    def add(body):
        objs.append(body)
        return len(objs)

    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    pages_id = len(objs) + 2 * len(pages) + 1
    for text in pages:
        stream = b"BT /F1 40 Tf 40 300 Td (" + text.encode() + b") Tj ET"
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        kids.append(add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 842 595] "
                        b"/Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>"
                        % (pages_id, font, content)))
    assert add(b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % k for k in kids)
               + b"] /Count %d >>" % len(kids)) == pages_id
    catalog = add(b"<< /Type /Catalog /Pages %d 0 R >>" % pages_id)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objs) + 1, catalog, xref)
    return bytes(out)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    pages = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    os.makedirs(out_dir, exist_ok=True)
    expected = []
    for doc in range(1, n + 1):
        texts = [page_words(doc, p) for p in range(1, pages + 1)]
        with open(os.path.join(out_dir, "doc-%d.pdf" % doc), "wb") as f:
            f.write(pdf(texts))
        expected += ["doc-%d page %d: %s" % (doc, p, t) for p, t in enumerate(texts, 1)]
    with open(os.path.join(out_dir, "expected.txt"), "w") as f:
        f.write("\n".join(expected) + "\n")


if __name__ == "__main__":
    main()
