"""The PDF edition, as built by ``scripts/build_pdf.sh``: complete, with every reference resolved.

Reads ``_build/latex/attention-executed.pdf`` with poppler's ``pdfinfo`` and ``pdftotext`` and the
LaTeX log beside it. Skipped when there is no PDF, unless ``REQUIRE_PDF_TEST=1`` (as in CI, after
the build), which turns a missing PDF or tool into a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
LATEX = ROOT / "_build" / "latex"
PDF = LATEX / "attention-executed.pdf"
LOG = LATEX / "attention-executed.log"
REQUIRED = os.environ.get("REQUIRE_PDF_TEST") == "1"
CHAPTERS = sorted(ROOT.glob("chapters/[0-9][0-9]_*.ipynb"))

if not (PDF.is_file() and shutil.which("pdftotext") and shutil.which("pdfinfo")):
    if REQUIRED:
        raise RuntimeError(f"REQUIRE_PDF_TEST=1 but {PDF} or poppler's pdftotext/pdfinfo is missing")
    pytest.skip("no PDF built (bash scripts/build_pdf.sh) or no pdftotext", allow_module_level=True)


@cache
def text() -> str:
    out = subprocess.run(["pdftotext", "-layout", str(PDF), "-"], capture_output=True, text=True, check=True)
    return out.stdout


def flat() -> str:
    """The text with hyphenation and line breaks undone and LaTeX's typographic apostrophe (U+2019)
    written as the notebooks write it, for phrase searches."""
    return re.sub(r"\s+", " ", re.sub(r"-\n\s*", "", text())).replace("\u2019", "'")


def _title(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        m = re.search(r"^# (.+)$", cell.source, re.M) if cell.cell_type == "markdown" else None
        if m:
            return m.group(1).strip()
    raise AssertionError(f"{path.name} has no title")


def _widget_outputs() -> int:
    n = 0
    for path in CHAPTERS + [ROOT / "instructors.ipynb"]:
        for cell in nbformat.read(path, as_version=4).cells:
            for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
                n += "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    return n


def test_page_count_and_size():
    info = subprocess.run(["pdfinfo", str(PDF)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    # ten chapters, the instructor's guide, glossary, API reference and bibliography
    assert 150 <= pages <= 1000, pages
    assert PDF.stat().st_size > 1_000_000


def test_every_chapter_title_is_present():
    body = flat()
    for path in CHAPTERS:
        title = re.sub(r"\s*\$[^$]*\$", "", _title(path)).strip()  # math prints as symbols
        assert title in body, f"chapter title {title!r} ({path.name}) is not in the PDF"
    for heading in ("Glossary", "References", "Library reference"):
        assert heading in body


def test_no_unresolved_reference_or_citation():
    assert "??" not in text(), "an unresolved reference prints as ??"
    log = LOG.read_text(encoding="utf-8", errors="replace")
    for pattern in (r"Reference `[^']*' on page \d+ undefined", r"Citation `[^']*' .*undefined"):
        assert not re.search(pattern, log), re.search(pattern, log).group(0)


def test_no_missing_figure():
    log = LOG.read_text(encoding="utf-8", errors="replace")
    assert not re.search(r"File `[^']+' not found", log)
    assert "Missing image" not in log
    images = subprocess.run(["pdfimages", "-list", str(PDF)], capture_output=True, text=True, check=True).stdout
    assert len(images.splitlines()) - 2 >= 50  # the chapters' figures, widget frames included


def test_widgets_print_their_default_frame():
    body = flat()
    assert "VBox(children=" not in body, "a widget printed as its text repr"
    printed = body.count("Interactive figure, printed at its default setting")
    assert printed == _widget_outputs() > 0


def test_folded_solutions_are_printed():
    body = flat()
    solutions = 0
    for path in CHAPTERS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                solutions += len(re.findall(r"^(`{3,}|:{3,})\{solution\}", cell.source, re.M))
    assert solutions > 0
    assert body.count("Solution to Exercise") >= solutions
