"""Nothing a user has is lost: the student-edition command (and its --nbgrader course) refuses to
write into the book's chapters or over existing files, checks every notebook before writing any,
and reports every error in one line on stderr with exit status 2.

Every refusal also checks that the bytes of every file already there are unchanged."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_lib import student
from transformer_lib.student import EditionError, MalformedNotebookError, UnsafeOutputError
from transformer_lib.student.cli import main

ROOT = Path(__file__).resolve().parent.parent
MODES = {"student": [], "nbgrader": ["--nbgrader"]}


@pytest.fixture
def book(tmp_path):
    """A small book: two real chapters (their exercises and checks) in tmp_path/book/chapters."""
    chapters = tmp_path / "book" / "chapters"
    chapters.mkdir(parents=True)
    for name in ("03_scaling.ipynb", "04_masking.ipynb"):
        shutil.copy(ROOT / "chapters" / name, chapters / name)
    return chapters


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run(mode: str, out, chapters, *extra: str) -> int:
    return main([str(out), "--chapters", str(chapters), *MODES[mode], *extra])


def one_error_line(capsys, *words: str) -> str:
    """The command printed exactly one line on stderr, starting with "error:", holding every word."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    return err


def write_nb(path: Path, cells: list, nbformat: int = 4) -> None:
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": nbformat, "nbformat_minor": 5}))


# --- refusals: the book's own notebooks -----------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_refuses_the_chapters_folder_even_with_force(mode, book, capsys):
    before = snapshot(book.parent)
    for extra in ([], ["--force"]):
        assert run(mode, book, book, *extra) == 2
        one_error_line(capsys, "refusing", "chapters folder", str(book))
    assert snapshot(book.parent) == before


@pytest.mark.parametrize("mode", MODES)
def test_refuses_a_folder_inside_chapters(mode, book, capsys):
    before = snapshot(book.parent)
    assert run(mode, book / "student", book, "--force") == 2
    one_error_line(capsys, "chapters folder")
    assert snapshot(book.parent) == before and not (book / "student").exists()


@pytest.mark.parametrize("mode", MODES)
def test_refuses_the_chapters_folder_through_a_link(mode, book, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(book, target_is_directory=True)
    before = snapshot(book.parent)
    assert run(mode, link, book, "--force") == 2
    one_error_line(capsys, "chapters folder", str(link))
    assert snapshot(book.parent) == before


@pytest.mark.parametrize("mode", MODES)
def test_refuses_a_folder_holding_the_source_notebooks(mode, book, tmp_path, capsys):
    copy = tmp_path / "my_copy_of_the_book"
    shutil.copytree(book, copy)
    before = snapshot(tmp_path)
    assert run(mode, copy, book, "--force") == 2
    one_error_line(capsys, "holds the book's notebook", "03_scaling.ipynb")
    assert snapshot(tmp_path) == before


def test_refusal_error_class(book):
    with pytest.raises(UnsafeOutputError, match="chapters folder"):
        student.make_student_edition(book, book)


# --- refusals: existing files ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_refuses_to_overwrite_a_students_work(mode, book, tmp_path, capsys):
    out = tmp_path / "class"
    assert run(mode, out, book) == 0
    capsys.readouterr()
    target = next(p for p in out.rglob("04_masking.ipynb"))
    target.write_text('{"my answers": "hours of work"}')  # the student's (or instructor's) own file
    before = snapshot(out)
    assert run(mode, out, book) == 2
    one_error_line(capsys, "already exists", "--force", str(out))
    assert snapshot(out) == before
    assert run(mode, out, book, "--force") == 0
    assert json.loads(target.read_text())["cells"], "--force writes the notebook again"


@pytest.mark.parametrize("mode", MODES)
def test_one_existing_file_means_nothing_is_written(mode, book, tmp_path, capsys):
    out = tmp_path / "class"
    out.mkdir()
    (out / "nbgrader_config.py").write_text("# mine\n")
    (out / "04_masking.ipynb").write_text("mine\n")
    (out / "notes.txt").write_text("keep me\n")
    before = snapshot(out)
    status = run(mode, out, book)
    assert status == 2
    one_error_line(capsys, "already exists")
    assert snapshot(out) == before


@pytest.mark.parametrize("mode", MODES)
def test_refuses_an_output_that_is_a_file(mode, book, tmp_path, capsys):
    out = tmp_path / "out.txt"
    out.write_text("not a folder\n")
    assert run(mode, out, book, "--force") == 2
    one_error_line(capsys, "not a folder", str(out))
    assert out.read_text() == "not a folder\n"


@pytest.mark.parametrize("mode", MODES)
def test_refuses_to_replace_a_folder_by_a_file(mode, book, tmp_path, capsys):
    out = tmp_path / "out"
    target = out / "04_masking.ipynb" if mode == "student" else out / "nbgrader_config.py"
    (target / "inside").mkdir(parents=True)
    assert run(mode, out, book, "--force") == 2
    one_error_line(capsys, "is a folder", str(target))
    assert (target / "inside").is_dir()


def test_an_unwritable_output_is_one_line(book, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run("student", blocker / "sub", book) == 2
    one_error_line(capsys, "cannot write", str(blocker))
    assert blocker.read_text() == "x"


def test_writes_are_atomic(book, tmp_path, monkeypatch):
    """A failure while writing leaves every file whole (old or new) and no temporary file."""
    out = tmp_path / "out"
    student.make_student_edition(out, book)
    before = snapshot(out)
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)  # the writes of student.notebooks
    with pytest.raises(OSError, match="No space"):
        student.make_student_edition(out, book, force=True)
    assert calls and snapshot(out) == before  # no temporary file left, old files whole


# --- every notebook is checked before any is written ------------------------------------------

GOOD_CELLS = json.loads((ROOT / "chapters" / "04_masking.ipynb").read_text())["cells"]
BAD_NOTEBOOKS = {
    "json": ("{not json", MalformedNotebookError, "not valid JSON"),
    "utf8": (b"\xff\xfe{}", MalformedNotebookError, "not UTF-8"),
    "no cells": ({"nbformat": 4}, MalformedNotebookError, "no list of cells"),
    "nbformat 3": ({"cells": [], "nbformat": 3}, MalformedNotebookError, "nbformat 3"),
    "cell type": ([{"cell_type": "picture", "source": ""}], MalformedNotebookError, "cell 1"),
    "cell not a dict": (["hello"], MalformedNotebookError, "cell 1"),
    "source": ([{"cell_type": "code", "source": 42, "metadata": {}}], MalformedNotebookError, "source"),
    "tags": ([{"cell_type": "code", "source": "", "metadata": {"tags": "solution"}}], MalformedNotebookError, "tags"),
    "syntax": (
        [{"cell_type": "markdown", "source": "x", "metadata": {}}]
        + [{"cell_type": "code", "source": "def f(:\n", "metadata": {"tags": ["solution"]}}],
        MalformedNotebookError,
        "cell 2",
    ),
    "no function": (
        [{"cell_type": "code", "source": "ANSWER = 3\n", "metadata": {"tags": ["solution"]}}],
        MalformedNotebookError,
        "must define a function",
    ),
}


def _write_bad(path: Path, content) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, list):
        write_nb(path, content)
    else:
        path.write_text(json.dumps(content))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", BAD_NOTEBOOKS)
def test_a_malformed_notebook_names_file_and_cell_and_nothing_is_written(mode, case, book, tmp_path, capsys):
    content, error, word = BAD_NOTEBOOKS[case]
    bad = book / "99_broken.ipynb"  # sorted last: the good chapters come first
    _write_bad(bad, content)
    out = tmp_path / "out"
    assert run(mode, out, book) == 2
    one_error_line(capsys, word, "99_broken.ipynb")
    assert not out.exists()
    with pytest.raises(error, match=word):
        student.load_notebooks(book)


def test_a_malformed_notebook_is_also_caught_with_force(book, tmp_path, capsys):
    out = tmp_path / "out"
    student.make_student_edition(out, book)
    before = snapshot(out)
    write_nb(book / "99_broken.ipynb", [{"cell_type": "code", "source": "def f(:", "metadata": {"tags": ["solution"]}}])
    assert run("student", out, book, "--force") == 2
    one_error_line(capsys, "99_broken.ipynb, cell 1", "does not parse")
    assert snapshot(out) == before


def test_course_needs_a_check_after_each_solution(book, tmp_path, capsys):
    cells = [
        {"cell_type": "markdown", "source": "```{exercise} E\n:label: ex-04-1\nDo.\n```", "metadata": {}},
        {"cell_type": "code", "source": "def f(x):\n    return x\n", "metadata": {"tags": ["solution"]}},
    ]
    write_nb(book / "99_broken.ipynb", cells)
    assert run("nbgrader", tmp_path / "out", book) == 2
    one_error_line(capsys, "99_broken.ipynb", "ex-04-1", "not followed by a check")
    cells.append({"cell_type": "code", "source": "print(f(1))\n", "metadata": {}})
    write_nb(book / "99_broken.ipynb", cells)
    assert run("nbgrader", tmp_path / "out", book) == 2
    one_error_line(capsys, "99_broken.ipynb, cell 3", "calls no check")
    assert not (tmp_path / "out").exists()


def test_course_needs_points_for_each_exercise(book, tmp_path, capsys):
    cells = [
        {"cell_type": "markdown", "source": "```{exercise} E\n:label: ex-99-1\nDo.\n```", "metadata": {}},
        {"cell_type": "code", "source": "def f(x):\n    return x\n", "metadata": {"tags": ["solution"]}},
        {"cell_type": "code", "source": "result = tl.exercises.ch99.check_f(f)\n", "metadata": {}},
    ]
    write_nb(book / "99_broken.ipynb", cells)
    assert run("nbgrader", tmp_path / "out", book) == 2
    one_error_line(capsys, "99_broken.ipynb, cell 2", "'ex-99-1'", "POINTS")
    assert not (tmp_path / "out").exists()


# --- the command line -------------------------------------------------------------------------


def test_unknown_chapter_names_the_value(book, tmp_path, capsys):
    assert run("student", tmp_path / "out", book, "--chapter", "04_maskin") == 2
    one_error_line(capsys, "'04_maskin'", "04_masking")
    assert not (tmp_path / "out").exists()


def test_only_the_chosen_chapters(book, tmp_path, capsys):
    assert run("student", tmp_path / "out", book, "--chapter", "04_masking") == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["04_masking.ipynb"]


def test_usage_errors_are_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["out", "--no-such-flag"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-such-flag" in err


def test_debug_shows_the_exception(book):
    with pytest.raises(UnsafeOutputError):
        run("student", book, book, "--debug")
    assert issubclass(UnsafeOutputError, EditionError) and issubclass(MalformedNotebookError, EditionError)


@pytest.mark.parametrize("mode", MODES)
def test_the_real_command_prints_no_traceback(mode, book):
    """Through ``python -m`` (a separate process, as a user runs it)."""
    cmd = [sys.executable, "-m", "transformer_lib.student", str(book), "--chapters", str(book), *MODES[mode]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "refusing" in done.stderr and "Traceback" not in done.stderr
