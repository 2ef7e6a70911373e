"""No solution reaches students, table by table: every form the book renders as a solution is
removed from the student edition (and kept only in nbgrader's solution cells of the course), every
ambiguous form is refused naming the file and the cell, a solution class keeps a stub, every path
written is checked (a link into the chapters is refused), and a two-part exercise gives a course
that nbgrader itself accepts, with the exercise's points."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from transformer_lib.student import UnsafeOutputError
from transformer_lib.student.cli import main
from transformer_lib.student.edition import STUB_LINE, stub_source
from transformer_lib.student.nbgrader import BEGIN, END, POINTS, make_course, mark_solutions

ROOT = Path(__file__).resolve().parent.parent
NBGRADER = ROOT / ".venv-instructors" / "bin" / "nbgrader"
SECRET = "the-model-answer-42"
MODES = {"student": [], "nbgrader": ["--nbgrader"]}


def md(source, *tags):
    return {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": source}


def code(source, *tags):
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": source, "outputs": [],
            "execution_count": None}  # fmt: skip


EXERCISE = "```{exercise} Write the causal mask\n:label: ex-04-1\n\nWrite `my_mask(T)`.\n```\n"
SOLUTION = code('def my_mask(T):\n    """Bool (T, T)."""\n    return torch.tril(torch.ones(T, T, dtype=torch.bool))\n',
                "solution", "hide-input")  # fmt: skip
CHECK = code("result = tl.exercises.masking.check_causal_mask(my_mask)\n")


def book_with(tmp_path, cells):
    chapters = tmp_path / "book" / "chapters"
    chapters.mkdir(parents=True, exist_ok=True)
    nb = {"cells": [md(EXERCISE), SOLUTION, CHECK, *cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (chapters / "04_masking.ipynb").write_text(json.dumps(nb))
    return chapters


def written(body, fence="```", close=None):
    return f"{fence}{{solution}} ex-04-1\n:class: dropdown\n\n{body}\n{close or fence}\n"


# (cells added after the exercise's check, None: removed, else a word of the refusal)
SOLUTION_FORMS = {
    "a raw cell tagged solution": ([{"cell_type": "raw", "metadata": {"tags": ["solution"]}, "source": SECRET}], None),
    "a tilde fence": ([md(written(SECRET, "~~~"), "solution")], None),
    "a tilde fence inside other text": ([md("Some prose.\n\n" + written(SECRET, "~~~") + "\nMore prose.\n")], None),
    "a colon fence": ([md(written(SECRET, ":::"), "solution")], None),
    "an indented fence": ([md("Prose.\n\n   " + written(SECRET).replace("\n```", "\n   ```"))], None),
    "a longer closing fence": ([md("Prose.\n\n" + written(SECRET, "```", "````") + "\nafter\n")], None),
    "an unterminated block": ([md("Prose.\n\n```{solution} ex-04-1\n" + SECRET + "\n")], "never closed"),
    "an unterminated tilde block": ([md("~~~~{solution} ex-04-1\n" + SECRET + "\n~~~\n", "solution")], "never closed"),
    "solution-start and solution-end": (
        [md(f"```{{solution-start}} ex-04-1\n```\n\n{SECRET}\n\n```{{solution-end}}\n```\n")],
        "solution-start",
    ),
}


def outside_solution_cells(folder: Path) -> str:
    """The text of every cell of every notebook under ``folder`` that nbgrader does not treat as a solution."""
    texts = []
    for path in folder.rglob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if not cell["metadata"].get("nbgrader", {}).get("solution"):
                texts.append(json.dumps(cell))
    return "\n".join(texts)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", SOLUTION_FORMS)
def test_every_form_of_solution_is_removed_or_refused(form, mode, tmp_path, capsys):
    cells, refusal = SOLUTION_FORMS[form]
    chapters = book_with(tmp_path, cells)
    out = tmp_path / "out"
    code_ = main([str(out), "--chapters", str(chapters), *MODES[mode]])
    err = capsys.readouterr().err
    if refusal is None:
        assert code_ == 0, err
        assert SECRET not in outside_solution_cells(out)
        if mode == "student":
            assert SECRET not in "".join(p.read_text() for p in out.rglob("*.ipynb"))
    else:
        assert code_ == 2 and refusal in err and "04_masking.ipynb, cell 4" in err and err.count("\n") == 1, err
        assert not out.exists()


CLASS_SOLUTION = '''import torch
from torch import nn


class MyHead(nn.Module):
    """One attention head."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Linear(d, d)  # model-answer line

    @torch.no_grad()
    def forward(self, x):
        """Apply it."""
        return self.w(x) * 2  # model-answer line
'''


def test_a_solution_class_keeps_a_stub_in_both_editions():
    namespace = {}
    stub = stub_source(CLASS_SOLUTION)
    exec(stub, namespace)  # the student's check finds the class: no NameError
    assert "model-answer" not in stub and "MyHead" in namespace
    with pytest.raises(NotImplementedError):
        namespace["MyHead"](4)
    assert namespace["MyHead"].forward.__doc__ == "Apply it." and STUB_LINE in stub

    marked = mark_solutions(CLASS_SOLUTION)  # nbgrader keeps what lies outside the markers
    cleared, inside = [], False
    for line in marked.splitlines():
        if line.strip() in (BEGIN, END):
            inside = line.strip() == BEGIN
            if inside:
                cleared.append(line.replace(BEGIN, "raise NotImplementedError()"))
            continue
        if not inside:
            cleared.append(line)
    release = "\n".join(cleared) + "\n"
    namespace = {}
    exec(release, namespace)
    assert "model-answer" not in release and "MyHead" in namespace
    with pytest.raises(NotImplementedError):
        namespace["MyHead"](4)


@pytest.mark.parametrize("mode", MODES)
def test_a_solution_class_without_methods_is_refused(mode, tmp_path, capsys):
    chapters = book_with(tmp_path, [code("class Settings:\n    width = 3\n", "solution")])
    assert main([str(tmp_path / "out"), "--chapters", str(chapters), *MODES[mode]]) == 2
    assert "04_masking.ipynb, cell 4: the solution class Settings has no method" in capsys.readouterr().err


# ---- every path actually written ----


def real_chapter(tmp_path):
    """A book whose chapters folder holds the real chapter "Masking"."""
    chapters = tmp_path / "book" / "chapters"
    chapters.mkdir(parents=True)
    shutil.copy(ROOT / "chapters" / "04_masking.ipynb", chapters)
    return chapters


def test_a_course_folder_linked_into_the_chapters_is_refused_even_with_force(tmp_path, capsys):
    chapters = real_chapter(tmp_path)
    before = (chapters / "04_masking.ipynb").read_bytes()
    out = tmp_path / "course"
    (out / "source").mkdir(parents=True)
    (out / "source" / "04_masking").symlink_to(chapters, target_is_directory=True)
    assert main([str(out), "--chapters", str(chapters), "--nbgrader", "--force"]) == 2
    err = capsys.readouterr().err
    assert "refusing to write" in err and "chapters folder" in err and err.count("\n") == 1
    assert (chapters / "04_masking.ipynb").read_bytes() == before
    with pytest.raises(UnsafeOutputError, match="leads to"):
        make_course(out, chapters, force=True)


def test_a_student_notebook_linked_to_a_chapter_is_refused(tmp_path, capsys):
    chapters = real_chapter(tmp_path)
    before = (chapters / "04_masking.ipynb").read_bytes()
    out = tmp_path / "edition"
    out.mkdir()
    (out / "04_masking.ipynb").symlink_to(chapters / "04_masking.ipynb")
    assert main([str(out), "--chapters", str(chapters), "--force"]) == 2
    assert "refusing to write" in capsys.readouterr().err
    assert (chapters / "04_masking.ipynb").read_bytes() == before


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("umask", "file_mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_student_files_get_the_mode_the_umask_allows(mode, umask, file_mode, tmp_path):
    chapters = book_with(tmp_path, [])
    old = os.umask(umask)
    try:
        assert main([str(tmp_path / "out"), "--chapters", str(chapters), *MODES[mode]]) == 0
    finally:
        os.umask(old)
    written_files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert written_files and all(p.stat().st_mode & 0o777 == file_mode for p in written_files)


# ---- a two-part exercise, validated by nbgrader itself ----

TWO_PARTS = [
    md("```{exercise} Two parts\n:label: ex-04-2\n\nPart a, then part b.\n```\n"),
    code('def part_a(x):\n    """A."""\n    return x\n', "solution", "hide-input"),
    code("result = tl.exercises.masking.check_part_a(part_a)\nresult2 = tl.exercises.masking.check_part_a2(part_a)\n"),
    code('def part_b(x):\n    """B."""\n    return x\n', "solution", "hide-input"),
    code("result = tl.exercises.masking.check_part_b(part_b)\n"),
    md("```{exercise} Written in two parts\n:label: ex-04-3\n\nSay a, then b.\n```\n"),
    md(written("Part a's answer.").replace("ex-04-1", "ex-04-3"), "solution"),
    md(written("Part b's answer.").replace("ex-04-1", "ex-04-3"), "solution"),
]


def test_a_two_part_exercise_gives_unique_grade_ids_and_its_points(tmp_path, capsys):
    chapters = book_with(tmp_path, TWO_PARTS)
    make_course(tmp_path / "course", chapters)
    nb = json.loads((tmp_path / "course" / "source" / "04_masking" / "04_masking.ipynb").read_text())
    metas = [c["metadata"]["nbgrader"] for c in nb["cells"] if "nbgrader" in c["metadata"]]
    ids = [m["grade_id"] for m in metas]
    assert len(ids) == len(set(ids)) == 9
    assert {"ex-04-2-code", "ex-04-2-code-2", "ex-04-2-check-3", "ex-04-3-answer-2"} <= set(ids)
    for label in ("ex-04-1", "ex-04-2", "ex-04-3"):
        assert sum(m.get("points", 0) for m in metas if m["grade_id"].startswith(label + "-")) == POINTS[label]
    out = capsys.readouterr().out
    total = POINTS["ex-04-1"] + POINTS["ex-04-2"]
    assert f"4 autograded cell(s), {total} points; 2 written, {POINTS['ex-04-3']} points" in out


@pytest.mark.slow
def test_nbgrader_accepts_the_course_of_a_two_part_exercise(tmp_path):
    if not NBGRADER.exists():
        if os.environ.get("NBGRADER_REQUIRED") == "1":
            pytest.fail(f"nbgrader is not installed at {NBGRADER} (see requirements-instructors.txt)")
        pytest.skip("nbgrader is not installed in .venv-instructors (bash scripts/test.sh installs it)")
    chapters = book_with(tmp_path, TWO_PARTS)
    course = tmp_path / "course"
    make_course(course, chapters)
    source = course / "source" / "04_masking" / "04_masking.ipynb"
    python = NBGRADER.parent / "python"
    validate = (
        "import sys, nbformat\nfrom nbgrader.nbgraderformat import MetadataValidator\n"
        "MetadataValidator().validate_nb(nbformat.read(sys.argv[1], as_version=4))\n"
    )
    done = subprocess.run([str(python), "-c", validate, str(source)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "jc"), "JUPYTER_DATA_DIR": str(tmp_path / "jd")}
    env["PATH"] = f"{NBGRADER.parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run([str(NBGRADER), "generate_assignment", "04_masking"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    read = (
        "import json\nfrom nbgrader.api import Gradebook\n"
        "with Gradebook('sqlite:///gradebook.db') as gb:\n"
        "    nb = gb.find_notebook('04_masking', '04_masking')\n"
        "    print(json.dumps([nb.max_score, sorted(c.name for c in nb.grade_cells)]))\n"
    )
    done = subprocess.run([str(python), "-c", read], cwd=course, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    max_score, cells = json.loads(done.stdout)
    assert max_score == POINTS["ex-04-1"] + POINTS["ex-04-2"] + POINTS["ex-04-3"] and len(cells) == 6
    release = (course / "release" / "04_masking" / "04_masking.ipynb").read_text()
    assert "Part a's answer" not in release and "return x" not in release
