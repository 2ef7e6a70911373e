"""The student edition: solution cells stubbed out, written solutions removed, outputs cleared
(instructors' guide). Reading, checking and safely writing the notebooks is :mod:`.notebooks`'s."""

from __future__ import annotations

import ast
from pathlib import Path

from .notebooks import (
    SOLUTION_TAG,
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

__all__ = ["make_student_edition", "strip_notebook", "stub_source"]

STUB_LINE = 'raise NotImplementedError("write your answer here")'


def function_body_start(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, str]:
    """Instructors' guide: where the answer part of a function starts.

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
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.body[0].lineno == node.lineno:
            lines[node.lineno - 1 : node.end_lineno] = ast.unparse(node).splitlines()
    return "\n".join(lines) + "\n"


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
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            header_end, indent = function_body_start(node)
            if out:
                out.extend(["", ""])
            out.extend(lines[first - 1 : header_end])
            out.append(f"{indent}# Your code here.")
            out.append(f"{indent}{STUB_LINE}")
    return "\n".join(out) + "\n"


def strip_notebook(nb: dict) -> tuple[dict, int]:
    """Instructors' guide: the student version of a notebook (JSON data) and the number of stubbed cells."""
    cells, stubs = [], 0
    for _, cell in teaching_cells(nb):
        src = cell_source(cell)
        is_solution = SOLUTION_TAG in tags(cell)
        if cell["cell_type"] == "markdown":
            if is_solution:
                continue
            src = without_solution_directives(src)
        elif cell["cell_type"] == "code":
            if is_solution:
                src = stub_source(src)
                stubs += 1
                cell["metadata"]["tags"] = [*exercise_tags(cell), "exercise-stub"]
            clear_outputs(cell)
        cell["source"] = src
        cells.append(cell)
    return with_cells(nb, cells), stubs


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
