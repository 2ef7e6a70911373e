"""The book's exercises as an nbgrader course: graded assignments for instructors.

    python -m transformer_lib.student COURSE --nbgrader [--chapter masking ...] [--force]

writes an nbgrader course folder:

- ``nbgrader_config.py``;
- ``source/<chapter>/<chapter>.ipynb`` for every chapter, in which every coding exercise's model
  answer (each function's body) sits between nbgrader's ``### BEGIN SOLUTION`` and
  ``### END SOLUTION`` markers, every check cell is a locked, autograded test cell that asserts
  the check passed (one test cell per check, so an exercise with two checks earns partial
  credit), and every written exercise becomes a manually graded answer cell that holds the
  model answer (nbgrader replaces it by "YOUR ANSWER HERE" in the release).

The points of every exercise are in one table, :data:`CHAPTER_POINTS`, by chapter. nbgrader itself is needed only
by instructors (``requirements-instructors.txt``); the same safety as the student edition
applies (see :mod:`transformer_lib.student.notebooks`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..chapters import CHAPTERS
from .edition import class_header_end, function_body_start, one_line_functions_expanded
from .notebooks import (
    SOLUTION_TAG,
    MalformedNotebookError,
    cell_source,
    clear_outputs,
    exercise_tags,
    load_notebooks,
    notebook_text,
    tags,
    teaching_cells,
    with_cells,
    without_solution_directives,
    write_files,
)

__all__ = ["CHAPTER_POINTS", "NBGRADER_CONFIG", "POINTS", "course_notebook", "make_course", "mark_solutions"]

#: Points of every exercise, by chapter (its slug, :mod:`transformer_lib.chapters`) and in the
#: order of the chapter's exercises. A coding exercise's points are shared equally by its checks
#: (one autograded test cell each); a written exercise is graded by hand.
CHAPTER_POINTS: dict[str, tuple[int, ...]] = {
    "why_attention": (2, 3, 2, 3),
    "queries_keys_values": (1, 3, 3, 2, 3),
    "scaling": (2, 3, 3, 3),
    "masking": (3, 4, 2, 3),
    "multihead": (3, 4, 4, 3),
    "positional_encoding": (2, 3, 4, 3),
    "transformer_block": (3, 4, 2, 3),
    "encoder_decoder": (3, 4, 2, 3),
    "gpt": (3, 3, 4, 3),
    "generation": (4, 2, 3),
    "long_context_and_precision": (4, 2, 3),
    "what_attention_learns": (3, 4, 2, 3),
    "tokens": (2, 3, 2, 2, 3),
    "todays_block": (2, 3, 2, 3),
    "fine_tuning": (2, 3, 2, 3, 3),
    "measuring_a_model": (3, 3, 2, 3),
    "preferences_and_rewards": (3, 3, 2, 3),
    "latent_sparse_sink": (3, 3, 2, 3),
    "attention_as_recurrence": (3, 3, 2, 2),
    "experts": (3, 3, 2, 2),
    "longer_than_trained": (3, 3, 2, 2),
}
#: The same points by the exercises' labels, ``ex-NN-k`` (the k-th exercise of the chapter in
#: place NN), as the notebooks label them: derived from :data:`CHAPTER_POINTS` and the chapters'
#: order, so a chapter inserted renumbers the labels here with no edit.
POINTS: dict[str, int] = {
    f"ex-{place:02d}-{k}": points
    for place, chapter in enumerate(CHAPTERS, start=1)
    for k, points in enumerate(CHAPTER_POINTS.get(chapter.slug, ()), start=1)
}

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"

NBGRADER_CONFIG = '''\
"""nbgrader configuration of the course made from "Attention, Executed"."""

c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = "attention-executed"
# Chapters train small models: give each cell up to ten minutes.
c.Execute.timeout = 600
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
'''

_EXERCISE_LABEL = re.compile(r"\{exercise\}[^\n]*\n(?::[^\n]*\n)*?:label:\s*(ex-\d+-\d+)")
_SOLUTION_BODY = re.compile(
    r"^[ ]{0,3}((?P<ch>[`~:])(?P=ch){2,})[ \t]*\{solution\}\s*(ex-\d+-\d+)[^\n]*\n(.*?)^[ ]{0,3}\1(?P=ch)*[ \t]*$",
    re.DOTALL | re.M,
)


def mark_solutions(source: str) -> str:
    """Instructors' guide: put nbgrader's solution markers around the answer part of a solution cell.

    Each function keeps its signature and docstring; its body goes between ``### BEGIN
    SOLUTION`` and ``### END SOLUTION``. Imports stay; any other top-level statement is marked
    as a whole.
    """
    source = one_line_functions_expanded(source)
    lines = source.splitlines()
    for node in reversed(ast.parse(source).body):  # bottom up, so earlier line numbers hold
        if not isinstance(node, ast.Import | ast.ImportFrom):
            _mark(node, lines)
    return "\n".join(lines) + "\n"


def _mark(node: ast.stmt, lines: list[str]) -> None:
    """Insert the markers around the answer part of ``node``: a function's body, each method's
    body of a class (whose header and docstring stay), or a whole other statement."""
    methods = [n for n in getattr(node, "body", []) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if isinstance(node, ast.ClassDef) and methods:
        for method in reversed(methods):
            _mark(method, lines)
        return
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        header_end, indent = class_header_end(node) if isinstance(node, ast.ClassDef) else function_body_start(node)
    else:
        header_end, indent = node.lineno - 1, " " * node.col_offset
    lines.insert(node.end_lineno, indent + END)
    lines.insert(header_end, indent + BEGIN)


def _nbgrader(grade_id: str, *, grade: bool, solution: bool, locked: bool, points: float | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    meta["task"] = False
    return meta


def _new_cell(kind: str, source: str, meta: dict) -> dict:
    cell = {"cell_type": kind, "id": meta["grade_id"], "metadata": {"nbgrader": meta}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def _test_cells(label: str, source: str, where: str, first: int = 1) -> list[dict]:
    """One locked, autograded test cell per check call in a check cell's ``source``, numbered
    from ``first`` (the points are set once every check of the exercise is known)."""
    checks = []
    for node in ast.parse(source).body:
        call = node.value if isinstance(node, ast.Assign | ast.Expr) else None
        func = getattr(call, "func", None)
        if isinstance(func, ast.Attribute) and func.attr.startswith("check_"):
            checks.append(f"result = {ast.get_source_segment(source, call)}\nassert result, result.message")
    if not checks:
        raise MalformedNotebookError(f"{where}: the cell after the solution of {label} calls no check")
    return [
        _new_cell("code", text, _nbgrader(f"{label}-check-{k}", grade=True, solution=False, locked=True, points=0))
        for k, text in enumerate(checks, start=first)
    ]


def _share_points(cells: list[dict]) -> None:
    """Give the graded cells of each exercise (its checks, or the parts of a written answer)
    equal shares of its points, which add up to them."""
    graded: dict[str, list[dict]] = {}
    for cell in cells:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("grade"):
            graded.setdefault(re.match(r"ex-\d+-\d+", meta["grade_id"]).group(0), []).append(meta)
    for label, metas in graded.items():
        share = round(POINTS[label] / len(metas), 2)
        for meta in metas:
            meta["points"] = int(share) if share == int(share) else share
        last = round(POINTS[label] - sum(m["points"] for m in metas[:-1]), 2)  # takes the rounding
        metas[-1]["points"] = int(last) if last == int(last) else last


def _part_id(parts: dict[str, int], grade_id: str) -> str:
    """``grade_id`` for the first part of an exercise, ``grade_id-2``, ``-3``, ... for the next ones."""
    parts[grade_id] = parts.get(grade_id, 0) + 1
    return grade_id if parts[grade_id] == 1 else f"{grade_id}-{parts[grade_id]}"


def _written_answer(src: str, where: str) -> tuple[str, dict]:
    """The label of a written solution cell and the manually graded answer cell holding it."""
    match = _SOLUTION_BODY.search(src)
    if not match:
        raise MalformedNotebookError(f"{where}: a markdown solution cell without a {{solution}} directive")
    label, body = match.group(3), match.group(4)
    body = "\n".join(line for line in body.splitlines() if not line.startswith(":class:")).strip()
    meta = _nbgrader(f"{label}-answer", grade=True, solution=True, locked=False, points=_points(label, where))
    return label, _new_cell("markdown", body + "\n", meta)


def _points(label: str | None, where: str) -> int:
    if label not in POINTS:
        raise MalformedNotebookError(
            f"{where}: exercise {label!r} has no points in transformer_lib.student.nbgrader.CHAPTER_POINTS (POINTS)"
        )
    return POINTS[label]


def course_notebook(nb: dict, path: Path | str = "notebook") -> tuple[dict, dict[str, float]]:
    """Instructors' guide: the nbgrader source version of a chapter notebook (JSON data).

    Returns it with the points of each graded cell, by nbgrader ``grade_id``.
    """
    cells, label, coded, pending = [], None, set(), None
    parts: dict[str, int] = {}  # grade ids given so far, by kind: each part of an exercise gets its own
    for index, cell in teaching_cells(nb):
        where, src = f"{path}, cell {index + 1}", cell_source(cell)
        if pending is not None and cell["cell_type"] == "code":
            made = _test_cells(pending, src, where, first=parts.get(f"{pending}-check", 0) + 1)
            parts[f"{pending}-check"] = parts.get(f"{pending}-check", 0) + len(made)
            cells.extend(made)
            pending = None
            continue
        if cell["cell_type"] == "raw" and SOLUTION_TAG in tags(cell):
            continue  # shown as a solution by the book: never in the course
        if cell["cell_type"] == "markdown" and SOLUTION_TAG in tags(cell):
            written, answer = _written_answer(src, where)
            if written not in coded:  # a coding exercise is graded by its checks
                answer["metadata"]["nbgrader"]["grade_id"] = answer["id"] = _part_id(parts, f"{written}-answer")
                cells.append(answer)
            continue
        if cell["cell_type"] == "markdown":
            label = ([label] + _EXERCISE_LABEL.findall(src))[-1]
            src = without_solution_directives(src)
        elif SOLUTION_TAG in tags(cell):
            _points(label, where)
            coded.add(label)
            pending, src = label, mark_solutions(src)
            cell["metadata"] = {**cell["metadata"], "tags": exercise_tags(cell)}
            grade_id = _part_id(parts, f"{label}-code")
            cell["metadata"]["nbgrader"] = _nbgrader(grade_id, grade=False, solution=True, locked=False)
        clear_outputs(cell)
        cell["source"] = src
        cells.append(cell)
    if pending is not None:
        raise MalformedNotebookError(f"{path}: the solution of {pending} is not followed by a check cell")
    _share_points(cells)
    graded = [c["metadata"].get("nbgrader", {}) for c in cells]
    return with_cells(nb, cells), {m["grade_id"]: m["points"] for m in graded if "points" in m}


def make_course(
    out_dir: str | Path, chapters: str | Path = "chapters", force: bool = False, only: list[str] | None = None
) -> list[Path]:
    """Instructors' guide: write an nbgrader course folder for the notebooks in ``chapters``.

    ``out_dir/nbgrader_config.py`` and ``out_dir/source/<chapter>/<chapter>.ipynb``; every
    notebook is read and converted before any file is written, with the refusals of
    :func:`~transformer_lib.student.notebooks.write_files`. Returns the paths written.
    """
    chapters, out_dir = Path(chapters), Path(out_dir)
    files, summary = {out_dir / "nbgrader_config.py": NBGRADER_CONFIG}, {}
    for path, nb in load_notebooks(chapters, only):
        graded, points = course_notebook(nb, path)
        target = out_dir / "source" / path.stem / path.name
        files[target] = notebook_text(graded)
        auto = [v for k, v in points.items() if "-check-" in k]
        summary[target] = (len(auto), sum(auto), len(points) - len(auto), sum(points.values()) - sum(auto))
    write_files(files, out_dir, chapters, force)
    for target, (n_auto, p_auto, n_manual, p_manual) in summary.items():
        print(f"{target}: {n_auto} autograded cell(s), {p_auto:g} points; {n_manual} written, {p_manual:g} points")
    return list(files)
