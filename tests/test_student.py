"""Tests for the student edition (transformer_lib/student/edition.py and notebooks.py): solutions
out, checks kept, and each student notebook runs, with every check reporting "not implemented yet"."""

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


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_student_edition_executes(student_edition, chapter):
    """The student notebook runs top to bottom without a traceback, and every check cell
    after a stub reports "not implemented yet"."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(student_edition / chapter.name, as_version=4)
    nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(student_edition)}},
    ).execute()
    seen_stub = False
    checks = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"cell raised {errors[0].ename}: {cell.source[:200]}"
        if "exercise-stub" in cell.metadata.get("tags", []):
            seen_stub = True
        elif seen_stub and "check_" in cell.source:
            text = "".join(o.get("text", "") for o in cell.outputs)
            assert "not implemented yet" in text, cell.source
            checks += 1
    assert seen_stub and checks >= 1
