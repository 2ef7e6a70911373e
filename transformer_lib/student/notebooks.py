"""Notebooks as the student edition and the nbgrader course read and write them: one room for
the tags, the ``{solution}`` directive, the walk over a notebook's cells, the checks of a source
notebook, and the safe, atomic writing of the results (instructors' guide)."""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path

from ..utils import atomic_write

__all__ = [
    "EditionError",
    "MalformedNotebookError",
    "UnsafeOutputError",
    "load_notebooks",
    "write_files",
]

SOLUTION_TAG = "solution"
# a code cell that computes numbers a written solution quotes: folded in the book, left out of the
# student edition and of the course
WORKED_TAG = "solution-work"
# a written solution: a {solution} directive in a markdown cell, fenced by backticks, tildes or
# colons (MyST renders a directive in any of them), indented up to three spaces; the closing fence
# is at least as long as the opening one
_FENCE = r"^[ ]{0,3}(?P<fence>(?P<ch>[`~:])(?P=ch){2,})[ \t]*"
SOLUTION_DIRECTIVE = re.compile(_FENCE + r"\{solution\}.*?^[ ]{0,3}(?P=fence)(?P=ch)*[ \t]*$\n?", re.DOTALL | re.M)
_SOLUTION_OPENING = re.compile(_FENCE + r"\{solution(?P<gated>-start|-end)?\}", re.M)
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class EditionError(ValueError):
    """Instructors' guide: a student edition or course cannot be written; the message names the
    problem and the value (and the file)."""


class MalformedNotebookError(EditionError):
    """Instructors' guide: a source notebook is not valid (the message names the file and the cell)."""


class UnsafeOutputError(EditionError):
    """Instructors' guide: writing would destroy something the command did not make (the book's
    own notebooks, or an existing file without ``--force``)."""


def tags(cell: dict) -> list[str]:
    """Instructors' guide: the tags of a notebook cell (JSON data)."""
    return cell.get("metadata", {}).get("tags", [])


def cell_source(cell: dict) -> str:
    """Instructors' guide: a cell's source as one string (notebooks store a string or a list of lines)."""
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def without_solution_directives(source: str) -> str:
    """Instructors' guide: a markdown cell's ``source`` with every ``{solution}`` directive removed."""
    return SOLUTION_DIRECTIVE.sub("", source)


def solution_problem(source: str) -> str | None:
    """Instructors' guide: why the solutions in a markdown cell's ``source`` cannot be removed
    safely (a ``{solution}`` block never closed, or the gated ``solution-start``/``solution-end``
    form), or None when every one is a closed ``{solution}`` block."""
    opening = _SOLUTION_OPENING.search(without_solution_directives(source))
    if opening is None:
        return None
    if opening.group("gated"):
        return (
            f"the gated {{solution{opening.group('gated')}}} form, which CONTRIBUTING forbids: write the "
            f"solution as one {{solution}} block"
        )
    return f"a {{solution}} block opened with {opening.group('fence')} is never closed"


def methods(node: ast.ClassDef) -> list:
    """Instructors' guide: the functions and classes defined in a class's body."""
    return [n for n in node.body if isinstance(n, _DEFINITIONS)]


def exercise_tags(cell: dict) -> list[str]:
    """Instructors' guide: a solution cell's tags without those that hide it in the book."""
    return [t for t in tags(cell) if t not in ("hide-input", "remove-input", SOLUTION_TAG)]


def teaching_cells(nb: dict) -> Iterator[tuple[int, dict]]:
    """Instructors' guide: ``(index, cell)`` of every cell of a copy of ``nb`` that students may
    see (the worked numbers of written solutions left out); close with :func:`with_cells`."""
    for index, cell in enumerate(copy.deepcopy(nb["cells"])):
        if WORKED_TAG not in tags(cell):
            yield index, cell


def with_cells(nb: dict, cells: list[dict]) -> dict:
    """Instructors' guide: a copy of ``nb`` holding ``cells``, without the saved widget state."""
    nb = {key: cells if key == "cells" else copy.deepcopy(value) for key, value in nb.items()}
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def clear_outputs(cell: dict) -> None:
    """Instructors' guide: empty a code cell's outputs and execution count, in place."""
    if cell["cell_type"] == "code":
        cell.update(outputs=[], execution_count=None)


def _check_cell(path: Path, index: int, cell: object) -> None:
    """Raise MalformedNotebookError unless ``cell`` is a well-formed nbformat 4 cell."""
    where = f"{path}, cell {index + 1}"
    if not isinstance(cell, dict) or cell.get("cell_type") not in ("markdown", "code", "raw"):
        kind = cell.get("cell_type") if isinstance(cell, dict) else type(cell).__name__
        raise MalformedNotebookError(f"{where}: not a notebook cell (cell_type {kind!r})")
    src = cell.get("source")
    if not (isinstance(src, str) or (isinstance(src, list) and all(isinstance(s, str) for s in src))):
        raise MalformedNotebookError(f"{where}: source must be text, got {type(src).__name__}")
    meta = cell.get("metadata", {})
    if not isinstance(meta, dict) or not isinstance(meta.get("tags", []), list):
        raise MalformedNotebookError(f"{where}: metadata must be a mapping with a list of tags, got {meta!r}")
    if cell["cell_type"] == "markdown" and solution_problem(cell_source(cell)):
        raise MalformedNotebookError(f"{where}: {solution_problem(cell_source(cell))}")
    if cell["cell_type"] == "code" and SOLUTION_TAG in tags(cell):
        try:
            tree = ast.parse(cell_source(cell))
        except SyntaxError as exc:
            problem = f"the solution code does not parse ({exc.msg}, line {exc.lineno})"
            raise MalformedNotebookError(f"{where}: {problem}") from None
        if not any(isinstance(n, _DEFINITIONS) for n in tree.body):
            raise MalformedNotebookError(f"{where}: a solution cell must define a function or a class")
        bare = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not methods(n)]
        if bare:
            raise MalformedNotebookError(
                f"{where}: the solution class {bare[0]} has no method, so no stub can keep it and hide the answer: "
                f"put the answer in a method"
            )


def read_notebook(path: Path) -> dict:
    """Instructors' guide: read and check one source notebook (nbformat 4 JSON data).

    Raises MalformedNotebookError naming the file (and the cell) when it is not valid.
    """
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise MalformedNotebookError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise MalformedNotebookError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise MalformedNotebookError(f"{path}: not a notebook (no list of cells)")
    if nb.get("nbformat") != 4:
        raise MalformedNotebookError(f"{path}: nbformat {nb.get('nbformat')!r}, expected 4")
    for index, cell in enumerate(nb["cells"]):
        _check_cell(path, index, cell)
    return nb


def load_notebooks(chapters: str | Path, only: list[str] | None = None) -> list[tuple[Path, dict]]:
    """Instructors' guide: read and check the book's notebooks in ``chapters`` (all of them, or
    those named in ``only``, each by its chapter's slug, ``masking``, or by its file name without
    ``.ipynb``), before anything is written."""
    chapters = Path(chapters)
    if not chapters.is_dir():
        raise EditionError(f"no chapters folder at {chapters}")
    paths = sorted(chapters.glob("*.ipynb"))
    if not paths:
        raise EditionError(f"no notebooks found in {chapters}")
    if only:
        names = {p.stem for p in paths} | {_slug(p) for p in paths}
        unknown = [name for name in only if name not in names]
        if unknown:
            listed = ", ".join(sorted(p.stem for p in paths))
            raise EditionError(f"no chapter {unknown[0]!r} in {chapters} (chapters: {listed})")
        paths = [p for p in paths if p.stem in only or _slug(p) in only]
    return [(path, read_notebook(path)) for path in paths]


def _slug(path: Path) -> str:
    """The chapter's slug of a notebook ``NN_slug.ipynb``, which a renumbering leaves as it is."""
    return path.stem[3:] if re.fullmatch(r"\d\d_\w+", path.stem) else path.stem


def _is_book_notebook(path: Path) -> bool:
    """True when ``path`` is one of the book's source notebooks (it still holds solution cells)."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        return any(SOLUTION_TAG in tags(c) for c in nb.get("cells", []))
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def check_output_dir(out_dir: Path, chapters: Path) -> None:
    """Instructors' guide: refuse an output folder that is (or is inside) the book's chapters
    folder, or that holds the book's source notebooks, whatever ``--force`` says."""
    out, src = out_dir.resolve(), chapters.resolve()
    if out == src or src in out.parents:
        raise UnsafeOutputError(f"refusing to write into {out_dir}: it is the book's chapters folder or inside it")
    if out_dir.exists() and not out_dir.is_dir():
        raise UnsafeOutputError(f"output {out_dir} exists and is not a folder")
    for source in chapters.glob("*.ipynb"):
        if _is_book_notebook(out_dir / source.name):
            raise UnsafeOutputError(f"refusing to write into {out_dir}: it holds the book's notebook {source.name}")


def write_files(files: dict[Path, str], out_dir: Path, chapters: Path, force: bool = False) -> list[Path]:
    """Instructors' guide: write ``files`` (path -> text, all under ``out_dir``) safely.

    Refuses an unsafe ``out_dir`` (:func:`check_output_dir`) and, unless ``force``, any target
    that exists; nothing is written when it refuses.
    """
    check_output_dir(out_dir, chapters)
    book = chapters.resolve()
    for target in files:  # where each file really lands, through any link on the way
        real = target.resolve()
        if real == book or book in real.parents or _is_book_notebook(target):
            raise UnsafeOutputError(
                f"refusing to write {target}: it leads to {real}, in the book's chapters folder {chapters}"
            )
    existing = [p for p in files if p.exists()]
    if any(p.is_dir() for p in existing):
        raise UnsafeOutputError(f"{next(p for p in existing if p.is_dir())} is a folder, not a file")
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise UnsafeOutputError(
            f"{existing[0]} already exists{more}; use --force to overwrite, or choose another folder"
        )
    for target, text in files.items():
        atomic_write(target, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
    return list(files)


def notebook_text(nb: dict) -> str:
    """Instructors' guide: a notebook (JSON data) as the text of an ``.ipynb`` file."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
