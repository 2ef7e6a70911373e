"""Tests for the student edition (transformer_lib/student/edition.py and notebooks.py): solutions
out, checks kept, no cell left that reads a solution's names, and every check reporting "not implemented
yet" on its stub."""

import ast
import json
from pathlib import Path

import pytest

from transformer_lib.student import make_student_edition, strip_notebook, stub_source
from transformer_lib.student.cli import main

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def test_stub_keeps_signatures_and_docstrings_only():
    src = (
        "import torch\n\n"
        "def attention(q, k, v):\n"
        '    """Return softmax(q k^T / sqrt(d)) v."""\n'
        "    s = q @ k.T\n"
        "    return s.softmax(-1) @ v\n\n"
        "SECRET = 42\n"
        "def helper(x): return x * 2\n"
    )
    out = stub_source(src)
    tree = ast.parse(out)  # still valid Python
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert names == ["attention", "helper"]
    assert "import torch" in out and "Return softmax" in out
    assert "q @ k.T" not in out and "SECRET" not in out and "x * 2" not in out
    namespace = {}
    exec(out, namespace)
    with pytest.raises(NotImplementedError):
        namespace["attention"](1, 2, 3)


def _cell(kind, source, tags=()):
    cell = {"cell_type": kind, "metadata": {"tags": list(tags)}, "source": source}
    if kind == "code":
        cell.update(outputs=[{"output_type": "stream", "name": "stdout", "text": "x"}], execution_count=3)
    return cell


def test_strip_notebook_removes_solutions_and_outputs():
    nb = {
        "cells": [
            _cell("markdown", "```{exercise} Do it\n:label: ex-01-1\nWrite f.\n```"),
            _cell("code", "def f(x):\n    return x + 1\n", tags=["solution", "hide-input"]),
            _cell("code", "check(f)"),
            _cell("markdown", "```{solution} ex-01-1\n:class: dropdown\nAdd one.\n```", tags=["solution"]),
            _cell("markdown", "Intro\n\n````{solution} ex-01-2\n:class: dropdown\nHidden.\n````\nAfter."),
            _cell("code", "print(secret_number)", tags=["solution-work", "hide-cell"]),  # a written answer's numbers
        ],
        "metadata": {"widgets": {}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    out, stubs = strip_notebook(nb)
    assert stubs == 1
    assert len(out["cells"]) == 4
    assert "return x + 1" not in out["cells"][1]["source"]
    assert out["cells"][1]["metadata"]["tags"] == ["exercise-stub"]
    assert all(c.get("outputs", []) == [] for c in out["cells"])
    assert "Hidden" not in out["cells"][3]["source"] and "After." in out["cells"][3]["source"]
    assert "widgets" not in out["metadata"]
    assert "secret_number" not in str(out), "the numbers of a written answer are left out"
    assert nb["cells"][1]["source"].endswith("return x + 1\n")  # the input is not modified


def test_cli_reports_missing_chapters(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "--chapters", str(tmp_path / "nothing")]) == 2
    assert "no chapters folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "out"), "--chapters", str(tmp_path / "empty")]) == 2
    assert "no notebooks found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_stub_of_a_one_line_function():
    out = stub_source("def f(x): return x + 1\n")
    assert "x + 1" not in out and "def f(x):" in out
    namespace = {}
    exec(out, namespace)
    with pytest.raises(NotImplementedError):
        namespace["f"](1)


@pytest.fixture(scope="module")
def student_edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    make_student_edition(out, ROOT / "chapters")
    return out


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_edition_has_no_solutions(student_edition, chapter):
    original = json.loads(chapter.read_text(encoding="utf-8"))
    student = json.loads((student_edition / chapter.name).read_text(encoding="utf-8"))
    text = json.dumps(student)
    assert "{solution}" not in text
    n_solution_cells = sum("solution" in c["metadata"].get("tags", []) for c in original["cells"])
    stubs = [c for c in student["cells"] if "exercise-stub" in c["metadata"].get("tags", [])]
    assert n_solution_cells > len(stubs) >= 1, "each chapter has coding exercises and written solutions"
    assert all(c.get("outputs", []) == [] for c in student["cells"] if c["cell_type"] == "code")
    for stub in stubs:
        assert "NotImplementedError" in stub["source"]


def _code(source) -> ast.Module:
    """A code cell's source parsed, its IPython lines (``%magic``, ``!shell``) left out."""
    text = "".join(source) if isinstance(source, list) else source
    return ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))


def _bound(tree: ast.Module) -> set[str]:
    """The names a cell binds when it runs: assignments, loops, imports, functions and classes
    (not the names bound inside the bodies of the functions it defines)."""
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def _read(tree: ast.Module) -> set[str]:
    """Every name a cell reads, in its own statements and in the functions it defines."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _is_check(source) -> bool:
    return "tl.exercises." in ("".join(source) if isinstance(source, list) else source)


def solution_reads(book: dict, student: dict) -> list[str]:
    """Each read, in ``student`` (the student edition of the notebook ``book``), of a name that
    only a solution or a solution's left-out worked numbers bound in ``book``, outside the checks."""
    book_cells = [c for c in book["cells"] if c["cell_type"] == "code"]
    kept = iter([c for c in student["cells"] if c["cell_type"] == "code"])
    missing: dict[str, str] = {}  # a name the student's kernel lacks or holds as a stub -> why
    problems = []
    for cell in book_cells:
        tree, tags = _code(cell["source"]), cell["metadata"].get("tags", [])
        if "solution-work" in tags:
            for name in _bound(tree):
                missing[name] = "bound only by a solution's worked numbers, which the student edition leaves out"
            continue
        twin = next(kept)
        if "solution" in tags:
            assert "exercise-stub" in twin["metadata"]["tags"], twin["source"]
            for name in _bound(tree):
                missing[name] = "a solution, a stub in the student edition"
            continue
        assert "".join(twin["source"]) == "".join(cell["source"]), "the student edition changed a code cell"
        for statement in tree.body:  # in order: a cell may bind a name again, then read it
            one = ast.Module(body=[statement], type_ignores=[])
            if not _is_check(cell["source"]):
                problems += [f"{name} ({why}) read by: {''.join(cell['source'])[:120]!r}"
                             for name, why in missing.items() if name in _read(one)]  # fmt: skip
            for name in _bound(one):
                missing.pop(name, None)
    assert next(kept, None) is None, "the student edition has a code cell the book lacks"
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_edition_reads_no_name_of_a_solution(student_edition, chapter):
    """The student edition is the book's notebook, which nbval runs top to bottom, less the worked
    numbers of the written solutions and with each solution's bodies replaced by ``raise
    NotImplementedError``. So it runs top to bottom as the book does as long as no cell after a
    solution reads a name that only the solution gave (only the checks call the stubs) and no
    cell reads a name that only a left-out cell bound: found without executing it a second time."""
    book = json.loads(chapter.read_text(encoding="utf-8"))
    student = json.loads((student_edition / chapter.name).read_text(encoding="utf-8"))
    problems = solution_reads(book, student)
    assert not problems, "\n".join(problems)


def test_a_cell_that_reads_a_solution_or_its_worked_numbers_is_found():
    def cell(source, *tags):
        return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)}, "outputs": []}

    book = {"metadata": {}, "nbformat": 4, "nbformat_minor": 5, "cells": [
        cell("import transformer_lib as tl"),
        cell("def my_mask(T):\n    return T", "solution"),
        cell("result = tl.exercises.masking.check_causal_mask(my_mask)"),  # a check: calls the stub
        cell("worked = my_mask(3)", "solution-work"),
        cell("%matplotlib inline\nprint(worked)"),  # reads the worked numbers
        cell("print([my_mask(n) for n in range(2)])"),  # calls the stub
        cell("def my_mask(T):\n    return 2 * T\nprint(my_mask(1))"),  # its own: fine
    ]}  # fmt: skip
    student, _ = strip_notebook(book)
    problems = solution_reads(book, student)
    assert [p.split(" ")[0] for p in problems] == ["worked", "my_mask"]


@pytest.mark.slow  # a kernel per chapter
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_check_reports_a_stub_as_not_implemented_yet(student_edition, chapter):
    """The student edition's exercise cells, run as a student meets them: the chapter's imports,
    then every stub and every check, in a kernel. Each check runs and says "not implemented yet"
    (the checks make their own inputs, so they need nothing else of the notebook; the test above
    shows that the rest of the notebook runs as the book does)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(student_edition / chapter.name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = next(i for i, c in enumerate(code) if "import transformer_lib as tl" in c.source)
    stubs = [c for c in code if "exercise-stub" in c.metadata.get("tags", [])]
    checks = [c for c in code[first + 1 :] if _is_check(c.source) and c not in stubs]
    assert stubs and checks, "each chapter has coding exercises with checks"
    nb.cells = code[: first + 1] + [c for c in code[first + 1 :] if c in stubs or c in checks]
    nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(student_edition)}},
    ).execute()
    for cell in nb.cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"cell raised {errors[0].ename}: {cell.source[:200]}"
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs)
        assert "not implemented yet" in text, cell.source
