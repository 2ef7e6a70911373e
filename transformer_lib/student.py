"""Write the student edition of the book's notebooks: solutions out, checks kept.

    python -m transformer_lib.student OUT_DIR [--chapters chapters]

For every notebook under ``chapters/`` it writes a copy into ``OUT_DIR`` where

- each code cell tagged ``solution`` keeps its imports and the signature and docstring of each
  function, with the body replaced by ``raise NotImplementedError`` (the checks report "not
  implemented yet" for those);
- each markdown cell tagged ``solution`` (the written solutions) is removed, as is any
  ``{solution}`` directive left in other markdown cells;
- all outputs and execution counts are cleared.

The instructor's guide in the book explains how to hand the edition out.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import re
import sys
from pathlib import Path

__all__ = ["make_student_edition", "strip_notebook", "stub_source"]

SOLUTION_TAG = "solution"
STUB_LINE = 'raise NotImplementedError("write your answer here")'
_SOLUTION_DIRECTIVE = re.compile(r"(`{3,}|:{3,})\{solution\}.*?^\1[ \t]*$\n?", re.DOTALL | re.MULTILINE)


def stub_source(source: str) -> str:
    """Replace the body of every function in ``source`` with ``raise NotImplementedError``.

    Imports and the functions' signatures, decorators and docstrings are kept; any other
    top-level statement (which could reveal the answer) is dropped.
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.extend(lines[node.lineno - 1 : node.end_lineno])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            body_start = node.body[0].lineno
            has_doc = (
                isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)
            )
            if out:
                out.extend(["", ""])
            if body_start == node.lineno:  # a one-line function: rebuild its header
                header = copy.copy(node)
                header.body = [ast.Pass()]
                out.extend(ast.unparse(header).splitlines()[:-1])
                indent = " " * 4
            else:
                header_end = node.body[0].end_lineno if has_doc else body_start - 1
                out.extend(lines[first - 1 : header_end])
                indent = " " * node.body[0].col_offset
            out.append(f"{indent}# Your code here.")
            out.append(f"{indent}{STUB_LINE}")
    return "\n".join(out) + "\n"


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def strip_notebook(nb: dict) -> tuple[dict, int]:
    """Return the student version of a notebook (as JSON data) and the number of stubbed cells."""
    nb = copy.deepcopy(nb)
    cells, stubs = [], 0
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        is_solution = SOLUTION_TAG in _tags(cell)
        if cell["cell_type"] == "markdown":
            if is_solution:
                continue
            src = _SOLUTION_DIRECTIVE.sub("", src)
        elif cell["cell_type"] == "code":
            if is_solution:
                src = stub_source(src)
                stubs += 1
                tags = [t for t in _tags(cell) if t not in ("hide-input", "remove-input", SOLUTION_TAG)]
                cell["metadata"]["tags"] = [*tags, "exercise-stub"]
            cell["outputs"] = []
            cell["execution_count"] = None
        cell["source"] = src
        cells.append(cell)
    nb["cells"] = cells
    nb.get("metadata", {}).pop("widgets", None)
    return nb, stubs


def make_student_edition(out_dir: str | Path, chapters: str | Path = "chapters") -> list[Path]:
    """Write the student edition of every notebook in ``chapters`` into ``out_dir``."""
    chapters, out_dir = Path(chapters), Path(out_dir)
    notebooks = sorted(p for p in chapters.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks found in {chapters}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        nb, stubs = strip_notebook(json.loads(path.read_text(encoding="utf-8")))
        target = out_dir / path.name
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
        print(f"{target}: {stubs} exercise stub(s)")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib.student",
        description="Write the student edition of the chapter notebooks (solutions replaced by stubs).",
    )
    parser.add_argument("out_dir", help="folder to write the student notebooks into")
    parser.add_argument("--chapters", default="chapters", help="folder of the book's notebooks (default: chapters)")
    args = parser.parse_args(argv)
    try:
        make_student_edition(args.out_dir, args.chapters)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
