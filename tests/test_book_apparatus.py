"""The book's apparatus: every citation, glossary link and equation reference points at something
that exists, the glossary is large enough and defines each term once, and the API reference has a
current page for every public module of the library.

These read the sources only (no book build), so a broken reference is caught in seconds; the
``-W`` book build catches the same mistakes, and more, in CI.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import transformer_lib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import api_pages  # noqa: E402

ROLE = re.compile(r"\{(?P<role>[a-z:]+)\}`(?P<body>[^`]*)`")


def _pages() -> dict[str, str]:
    """Markdown text of every page of the book: chapters (markdown cells only) and .md pages."""
    pages = {}
    for path in sorted(ROOT.glob("chapters/*.ipynb")) + [ROOT / "instructors.ipynb"]:
        nb = nbformat.read(path, as_version=4)
        pages[path.name] = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for path in [ROOT / "intro.md", *ROOT.glob("*.md"), *ROOT.glob("api/*.md")]:
        if path.name not in ("README.md", "CONTRIBUTING.md"):
            pages[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    return pages


def _roles(kind: set[str]) -> list[tuple[str, str]]:
    found = []
    for page, text in _pages().items():
        for m in ROLE.finditer(text):
            if m.group("role") in kind:
                body = m.group("body")
                target = body.rsplit("<", 1)[1].rstrip(">") if body.endswith(">") and "<" in body else body
                found.append((page, target.strip()))
    return found


def _bib_keys() -> list[str]:
    return re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(encoding="utf-8"), re.M)


def _glossary_terms() -> list[str]:
    text = (ROOT / "glossary.md").read_text(encoding="utf-8")
    body = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    return [line.strip() for line in body.splitlines() if line and not line[0].isspace() and not line.startswith(":")]


def test_every_citation_is_in_the_bibliography():
    keys = _bib_keys()
    assert len(keys) == len(set(keys)), "a key is defined twice in references.bib"
    cites = _roles({"cite", "cite:p", "cite:t", "cite:ps", "cite:ts"})
    assert len(cites) >= 30
    for page, body in cites:
        for key in body.split(","):
            assert key.strip() in keys, f"{page}: {{cite}} of unknown key {key.strip()!r}"


def test_named_works_are_cited_not_typed():
    # "Author et al., 2020" typed in prose, rather than a {cite} role, is a citation that the
    # References page and the PDF do not know about.
    typed = re.compile(r"\b[A-Z][a-z]+ et al\.,? \(?\d{4}")
    for page, text in _pages().items():
        prose = ROLE.sub("", text)
        assert not typed.search(prose), f"{page}: {typed.search(prose).group(0)!r} is not a {{cite}} role"


def test_glossary_has_forty_terms_defined_once_and_every_link_resolves():
    terms = _glossary_terms()
    assert len(terms) >= 40
    lowered = [t.lower() for t in terms]
    assert len(lowered) == len(set(lowered)), "a glossary term is defined twice"
    links = _roles({"term"})
    assert len(links) >= 40
    for page, target in links:
        assert target.lower() in lowered, f"{page}: {{term}} {target!r} is not in the glossary"


def test_every_equation_reference_has_one_label():
    labels: dict[str, int] = {}
    for text in _pages().values():
        for label in re.findall(r"^\$\$ \((eq-[\w-]+)\)\s*$", text, re.M):
            labels[label] = labels.get(label, 0) + 1
    assert {"eq-attention", "eq-dot-variance", "eq-sinusoidal", "eq-online-softmax", "eq-kv-cache", "eq-mfu"} <= set(
        labels
    )
    assert all(n == 1 for n in labels.values()), labels
    refs = _roles({"eq"})
    assert {p for p, _ in refs} != set(), "no {eq} references"
    for page, target in refs:
        assert target in labels, f"{page}: {{eq}} {target!r} has no labelled equation"
    # each equation is referred to from somewhere, most from another chapter
    assert {t for _, t in refs} == set(labels)


def _public_modules() -> set[str]:
    names = set()
    for info in pkgutil.walk_packages(transformer_lib.__path__, "transformer_lib."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts[1:]):
            continue
        names.add(info.name)
    return names


def test_every_public_module_has_an_api_page():
    missing = _public_modules() - api_pages.documented_modules()
    assert not missing, f"no API page for {sorted(missing)}: add them to scripts/api_pages.py's PAGES"
    for module in api_pages.documented_modules():
        importlib.import_module(module)


def test_api_pages_are_current_and_in_the_table_of_contents():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "api_pages.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    for name, *_ in api_pages.PAGES:
        assert f"- file: api/{name}\n" in toc
    assert "api/index" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("path", sorted(ROOT.glob("chapters/[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_chapter_library_list_links_the_reference(path):
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    assert re.search(r"\{py:obj\}`tl\.", text), "the chapter's list of library names links none of them"
    assert "{doc}`transformer_lib." in text and "../api/" in text
