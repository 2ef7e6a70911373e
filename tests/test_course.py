"""Tests for the nbgrader course (transformer_lib/student/nbgrader.py): solution markers, autograded
test cells with the points of the table, manually graded written answers; nbgrader itself is not needed
here (tests/test_nbgrader.py runs it)."""

import ast
import json
import re
from pathlib import Path

import pytest

from transformer_lib.student.edition import cell_source, stub_source
from transformer_lib.student.nbgrader import BEGIN, END, POINTS, course_notebook, make_course, mark_solutions

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
LABEL = re.compile(r"\{exercise\}[^\n]*\n(?::[^\n]*\n)*?:label:\s*(ex-\d+-\d+)")


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def clear_regions(source: str, stub: str = "raise NotImplementedError()") -> str:
    """What nbgrader's ClearSolutions does: each marked region becomes the stub, at the marker's indent."""
    out, inside = [], False
    for line in source.split("\n"):
        if BEGIN in line:
            inside = True
            out.append(line[: line.index(BEGIN)] + stub)
        elif END in line:
            inside = False
        elif not inside:
            out.append(line)
    assert not inside
    return "\n".join(out)


def book_labels(nb) -> list[str]:
    return [m for c in nb["cells"] if c["cell_type"] == "markdown" for m in LABEL.findall(cell_source(c))]


def solution_cells(nb) -> list[str]:
    return [
        cell_source(c) for c in nb["cells"] if c["cell_type"] == "code" and "solution" in c["metadata"].get("tags", [])
    ]


def test_points_table_covers_exactly_the_books_exercises():
    labels = [label for path in CHAPTERS for label in book_labels(load(path))]
    assert len(labels) == len(set(labels))
    assert sorted(labels) == sorted(POINTS)
    assert all(isinstance(p, int) and p > 0 for p in POINTS.values())


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_marked_solutions_clear_to_the_signature_and_docstring(chapter):
    """Removing the markers gives back the model answer; clearing the regions keeps every
    function's signature and docstring (like the student edition) and none of its body."""
    for source in solution_cells(load(chapter)):
        marked = mark_solutions(source)
        unmarked = "\n".join(line for line in marked.split("\n") if BEGIN not in line and END not in line)
        assert ast.dump(ast.parse(unmarked)) == ast.dump(ast.parse(source))
        cleared = clear_regions(marked)
        tree = ast.parse(cleared)  # still valid Python
        stub_tree = ast.parse(stub_source(source))
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert [f.name for f in functions] == [n.name for n in stub_tree.body if isinstance(n, ast.FunctionDef)]
        for f, s in zip(functions, [n for n in stub_tree.body if isinstance(n, ast.FunctionDef)], strict=True):
            assert ast.get_docstring(f) == ast.get_docstring(s) and ast.dump(f.args) == ast.dump(s.args)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Return):
                assert ast.get_source_segment(source, node) not in cleared


def test_mark_solutions_handles_one_liners_and_other_statements():
    source = (
        "import math\n\ndef f(x): return x + 1\n\nSCALE = math.pi\n\n@staticmethod\ndef g(y):\n    return y * SCALE\n"
    )
    marked = mark_solutions(source)
    cleared = clear_regions(marked, "pass")
    assert "x + 1" not in cleared and "math.pi" not in cleared and "y * SCALE" not in cleared
    assert "import math" in cleared and "@staticmethod" in cleared and "def f(x):" in cleared
    namespace = {}
    exec(marked, namespace)  # the marked source still runs the model answer
    assert namespace["f"](1) == 2


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_course_notebook_grades_every_exercise_with_its_points(chapter):
    nb = load(chapter)
    course, points = course_notebook(nb, chapter.name)
    meta = [c["metadata"].get("nbgrader") for c in course["cells"]]
    ids = [m["grade_id"] for m in meta if m]
    assert len(ids) == len(set(ids)), "grade ids are unique"
    labels = book_labels(nb)
    for label in labels:  # each exercise's cells add up to its points in the table
        assert sum(p for gid, p in points.items() if gid.startswith(label + "-")) == pytest.approx(POINTS[label])
    n_checks = sum(
        len(re.findall(r"\.check_\w+\(", cell_source(c)))
        for prev, c in zip(nb["cells"], nb["cells"][1:], strict=False)
        if "solution" in prev["metadata"].get("tags", []) and prev["cell_type"] == "code"
    )
    tests = [c for c, m in zip(course["cells"], meta, strict=True) if m and m["grade"] and not m["solution"]]
    assert len(tests) == n_checks >= 1
    for cell in tests:  # a locked cell that fails unless the check passed
        assert cell["metadata"]["nbgrader"]["locked"] and "assert result, result.message" in cell["source"]
    answers = [m for m in meta if m and m["solution"]]
    assert len(answers) == len(labels), "one answer cell (code or written) per exercise"
    text = json.dumps(course)
    assert "{solution}" not in text
    assert not any("solution" in c["metadata"].get("tags", []) for c in course["cells"]), "no cell keeps the tag"
    hidden = [c for c, m in zip(course["cells"], meta, strict=True) if m and m["solution"]]
    assert not any("hide-input" in c["metadata"].get("tags", []) for c in hidden), "an answer cell is never hidden"
    assert all(c.get("outputs", []) == [] for c in course["cells"])
    assert nb == load(chapter), "the book's notebook is not modified"


def test_course_notebook_of_a_small_chapter():
    """A hand-made chapter, to see each kind of cell exactly."""

    def cell(kind, source, *tags):
        return {"cell_type": kind, "metadata": {"tags": list(tags)}, "source": source}

    cells = [
        cell("markdown", "```{exercise} Mask\n:label: ex-04-1\nWrite f.\n```"),
        cell("code", "def f(T):\n    return T\n", "solution", "hide-input"),
        cell("code", "r = tl.exercises.masking.check_causal_mask(f)\n"),
        cell("markdown", "```{solution} ex-04-1\nEasy.\n```", "solution"),
        cell("markdown", "```{exercise} Why\n:label: ex-04-3\nExplain.\n```"),
        cell("code", "print(the_numbers_of_the_answer)\n", "solution-work", "hide-cell"),
        cell("markdown", "```{solution} ex-04-3\n:class: dropdown\n\nBecause.\n```", "solution"),
    ]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    course, points = course_notebook(nb)
    assert points == {"ex-04-1-check-1": POINTS["ex-04-1"], "ex-04-3-answer": POINTS["ex-04-3"]}
    cells = course["cells"]
    assert len(cells) == 5  # the coding exercise's written solution and the worked numbers are dropped
    assert "the_numbers_of_the_answer" not in str(cells)
    assert cells[1]["source"] == f"def f(T):\n    {BEGIN}\n    return T\n    {END}\n"
    assert cells[2]["source"] == "result = tl.exercises.masking.check_causal_mask(f)\nassert result, result.message"
    assert cells[4]["cell_type"] == "markdown" and cells[4]["source"] == "Because.\n"
    assert cells[4]["metadata"]["nbgrader"] == {
        "grade": True, "grade_id": "ex-04-3-answer", "locked": False, "schema_version": 3, "solution": True,
        "points": POINTS["ex-04-3"], "task": False,
    }  # fmt: skip


def test_make_course_writes_config_and_sources(tmp_path, capsys):
    written = make_course(tmp_path / "course", ROOT / "chapters", only=["04_masking", "05_multihead"])
    rel = sorted(str(p.relative_to(tmp_path / "course")) for p in written)
    assert rel == ["nbgrader_config.py", "source/04_masking/04_masking.ipynb", "source/05_multihead/05_multihead.ipynb"]
    config = (tmp_path / "course" / "nbgrader_config.py").read_text()
    compile(config, "nbgrader_config.py", "exec")
    assert "c.Execute.timeout = 600" in config
    out = capsys.readouterr().out
    assert "04_masking.ipynb: 2 autograded cell(s), 7 points; 2 written, 5 points" in out
