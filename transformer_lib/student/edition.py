"""The student edition: solution cells stubbed out, written solutions removed, outputs cleared;
with the safety checks (never the book's own notebooks, never over existing files without force)."""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import tempfile
from pathlib import Path

__all__ = [
    "EditionError",
    "MalformedNotebookError",
    "UnsafeOutputError",
    "load_notebooks",
    "make_student_edition",
    "strip_notebook",
    "stub_source",
    "write_files",
]

SOLUTION_TAG = "solution"
# a code cell that computes numbers a written solution quotes: folded in the book, left out of the
# student edition and of the course
WORKED_TAG = "solution-work"
STUB_LINE = 'raise NotImplementedError("write your answer here")'
# A fence of backticks, tildes or colons (MyST renders a directive in any of them), indented up
# to three spaces; the closing fence is at least as long as the opening one.
_FENCE = r"^[ ]{0,3}(?P<fence>(?P<ch>[`~:])(?P=ch){2,})[ \t]*"
_SOLUTION_DIRECTIVE = re.compile(_FENCE + r"\{solution\}.*?^[ ]{0,3}(?P=fence)(?P=ch)*[ \t]*$\n?", re.DOTALL | re.M)
_SOLUTION_OPENING = re.compile(_FENCE + r"\{solution(?P<gated>-start|-end)?\}", re.M)


def solution_problem(source: str) -> str | None:
    """Instructors' guide: why the solutions in a markdown cell's ``source`` cannot be removed
    safely (a ``{solution}`` block never closed, or the gated ``solution-start``/``solution-end``
    form), or None when every one is a closed ``{solution}`` block."""
    opening = _SOLUTION_OPENING.search(_SOLUTION_DIRECTIVE.sub("", source))
    if opening is None:
        return None
    if opening.group("gated"):
        return (
            f"the gated {{solution{opening.group('gated')}}} form, which CONTRIBUTING forbids: write the "
            f"solution as one {{solution}} block"
        )
    return f"a {{solution}} block opened with {opening.group('fence')} is never closed"


class EditionError(ValueError):
    """Instructors' guide: a student edition or course cannot be written; the message names the
    problem and the value (and the file)."""


class MalformedNotebookError(EditionError):
    """Instructors' guide: a source notebook is not valid (the message names the file and the cell)."""


class UnsafeOutputError(EditionError):
    """Instructors' guide: writing would destroy something the command did not make (the book's
    own notebooks, or an existing file without ``--force``)."""


def function_body_start(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> tuple[int, str]:
    """Instructors' guide: where the answer part of a function (or a class) starts.

    Returns the last line (1-based) of the function's header, including its docstring when it
    has one, and the indentation of its body. Needs a function whose body starts on a line of
    its own.
    """
    first = node.body[0]
    value = first.value if isinstance(first, ast.Expr) else None
    has_doc = isinstance(value, ast.Constant) and isinstance(value.value, str)
    header_end = first.end_lineno if has_doc else first.lineno - 1
    return header_end, " " * first.col_offset


def one_line_functions_expanded(source: str) -> str:
    """Instructors' guide: ``source`` with every top-level ``def f(x): return x`` rewritten over
    several lines, so that each function's body starts on a line of its own."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in reversed(tree.body):
        if isinstance(node, _DEFINITIONS) and _inline(node):
            lines[node.lineno - 1 : node.end_lineno] = ast.unparse(node).splitlines()
    return "\n".join(lines) + "\n"


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _inline(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """The definition, or one inside a class, has its body start on its own header line."""
    if node.body[0].lineno == node.lineno:
        return True
    return isinstance(node, ast.ClassDef) and any(isinstance(n, _DEFINITIONS) and _inline(n) for n in node.body)


def _methods(node: ast.ClassDef) -> list:
    """The functions and classes defined in a class's body."""
    return [n for n in node.body if isinstance(n, _DEFINITIONS)]


def class_header_end(node: ast.ClassDef) -> tuple[int, str]:
    """Instructors' guide: the last line (1-based) of a class's header and docstring, and the
    indentation of its body (a decorated first method starts at its decorator)."""
    header_end, indent = function_body_start(node)
    first = node.body[0]
    if isinstance(first, _DEFINITIONS) and first.decorator_list:
        header_end = first.decorator_list[0].lineno - 1
    return header_end, indent


def stub_source(source: str) -> str:
    """Instructors' guide: replace the body of every function in ``source`` (a solution cell's
    code) with ``raise NotImplementedError``.

    Imports and the functions' signatures, decorators and docstrings are kept; any other
    top-level statement (which could reveal the answer) is dropped.
    """
    source = one_line_functions_expanded(source)
    tree = ast.parse(source)
    lines = source.splitlines()
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.extend(lines[node.lineno - 1 : node.end_lineno])
        elif isinstance(node, _DEFINITIONS):
            if out:
                out.extend(["", ""])
            out.extend(_stubbed(node, lines))
    return "\n".join(out) + "\n"


def _stubbed(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, lines: list[str]) -> list[str]:
    """The lines of a function, or of a class and its methods, with each body replaced by a stub."""
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    header_end, indent = class_header_end(node) if isinstance(node, ast.ClassDef) else function_body_start(node)
    out = lines[first - 1 : header_end]
    if not isinstance(node, ast.ClassDef):
        return [*out, f"{indent}# Your code here.", f"{indent}{STUB_LINE}"]
    for k, method in enumerate(_methods(node)):
        out.extend([""] * bool(k) + _stubbed(method, lines))
    return out


def tags(cell: dict) -> list[str]:
    """Instructors' guide: the tags of a notebook cell (JSON data)."""
    return cell.get("metadata", {}).get("tags", [])


def cell_source(cell: dict) -> str:
    """Instructors' guide: a cell's source as one string (notebooks store a string or a list of lines)."""
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


def strip_notebook(nb: dict) -> tuple[dict, int]:
    """Instructors' guide: the student version of a notebook (JSON data) and the number of stubbed cells."""
    nb = copy.deepcopy(nb)
    cells, stubs = [], 0
    for cell in nb["cells"]:
        if WORKED_TAG in tags(cell):
            continue
        src = cell_source(cell)
        is_solution = SOLUTION_TAG in tags(cell)
        if cell["cell_type"] != "code" and is_solution:  # markdown or raw: the book shows it as a solution
            continue
        if cell["cell_type"] == "markdown":
            src = _SOLUTION_DIRECTIVE.sub("", src)
        elif cell["cell_type"] == "code":
            if is_solution:
                src = stub_source(src)
                stubs += 1
                kept = [t for t in tags(cell) if t not in ("hide-input", "remove-input", SOLUTION_TAG)]
                cell["metadata"]["tags"] = [*kept, "exercise-stub"]
            cell["outputs"] = []
            cell["execution_count"] = None
        cell["source"] = src
        cells.append(cell)
    nb["cells"] = cells
    nb.get("metadata", {}).pop("widgets", None)
    return nb, stubs


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
        bare = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not _methods(n)]
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
    those whose file name without ``.ipynb`` is in ``only``), before anything is written."""
    chapters = Path(chapters)
    if not chapters.is_dir():
        raise EditionError(f"no chapters folder at {chapters}")
    paths = sorted(chapters.glob("*.ipynb"))
    if not paths:
        raise EditionError(f"no notebooks found in {chapters}")
    if only:
        names = {p.stem for p in paths}
        unknown = [name for name in only if name not in names]
        if unknown:
            raise EditionError(f"no chapter {unknown[0]!r} in {chapters} (chapters: {', '.join(sorted(names))})")
        paths = [p for p in paths if p.stem in only]
    return [(path, read_notebook(path)) for path in paths]


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


def _write_atomic(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a temporary file and a rename, so that it is never half-written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes it private: give it the mode the umask allows
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        _write_atomic(target, text)
    return list(files)


def notebook_text(nb: dict) -> str:
    """Instructors' guide: a notebook (JSON data) as the text of an ``.ipynb`` file."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def make_student_edition(
    out_dir: str | Path, chapters: str | Path = "chapters", force: bool = False, only: list[str] | None = None
) -> list[Path]:
    """Instructors' guide: write the student edition of the notebooks in ``chapters`` into ``out_dir``.

    Every notebook is read and checked before any is written; see :func:`write_files` for the
    refusals. Returns the paths written.
    """
    chapters, out_dir = Path(chapters), Path(out_dir)
    files, stubs = {}, {}
    for path, nb in load_notebooks(chapters, only):
        student, stubs[path.name] = strip_notebook(nb)
        files[out_dir / path.name] = notebook_text(student)
    written = write_files(files, out_dir, chapters, force)
    for target in written:
        print(f"{target}: {stubs[target.name]} exercise stub(s)")
    return written
