"""End to end with real nbgrader, offline, on chapter "Masking": write the course, release the
assignment (no solution text left in it), submit a right and a wrong copy, autograde both, read
nbgrader's own gradebook, and generate the feedback.

nbgrader lives in its own environment, ``.venv-instructors`` (``requirements-instructors.txt``;
``scripts/test.sh`` installs it with Python 3.11 or newer); without it the test is skipped,
unless ``NBGRADER_REQUIRED=1`` (set by ``scripts/test.sh`` once it built that environment), when
it fails. Notebooks run in a kernel of the book's own Python,
so they import this checkout's ``transformer_lib`` (the fixture registers it, as the guide says).

The recorded summary ``tests/data/nbgrader_04_masking.txt`` (shown in the instructors' guide) is
compared with this run's; ``UPDATE_RECORDED=1`` writes it instead."""

import ast
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib.student.nbgrader import BEGIN, END, POINTS, make_course

ROOT = Path(__file__).resolve().parent.parent
NBGRADER = ROOT / ".venv-instructors" / "bin" / "nbgrader"
RECORDED = ROOT / "tests" / "data" / "nbgrader_04_masking.txt"
CHAPTER = "04_masking"
RIGHT = "torch.tril(torch.ones(T, T, dtype=torch.bool))"
WRONG = "torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1)"  # forgets the diagonal

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nbgrader_env(tmp_path_factory):
    """Environment for the nbgrader commands: a "python3" kernel that is the book's Python, and
    Jupyter folders of their own (no user configuration)."""
    if not NBGRADER.exists():
        if os.environ.get("NBGRADER_REQUIRED") == "1":
            pytest.fail(f"nbgrader is not installed at {NBGRADER} (see requirements-instructors.txt)")
        if sys.version_info < (3, 11):
            pytest.skip("nbgrader 0.9 needs Python 3.11 or newer (scripts/test.sh skips its environment below it)")
        pytest.skip("nbgrader is not installed in .venv-instructors (bash scripts/test.sh installs it)")
    # The step of the instructors' guide: nbgrader's "python3" kernel is the book's Python.
    prefix = str(NBGRADER.parent.parent)
    install = [sys.executable, "-m", "ipykernel", "install", "--prefix", prefix, "--name", "python3"]
    done = subprocess.run([*install, "--display-name", "Python 3 (the book)"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    jupyter = tmp_path_factory.mktemp("jupyter")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(jupyter / "config")}
    env.update(JUPYTER_DATA_DIR=str(jupyter / "data"), PYTHONHASHSEED="0", OMP_WAIT_POLICY="PASSIVE")
    env["PATH"] = f"{NBGRADER.parent}{os.pathsep}{env.get('PATH', '')}"  # nbgrader runs its own "alembic"
    return env


def nbgrader(env, course: Path, *args: str) -> None:
    done = subprocess.run([str(NBGRADER), *args], cwd=course, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def submit(course: Path, release: dict, answers: dict[str, str], student: str) -> None:
    """Write ``student``'s submission: the release with each solution cell's source replaced."""
    nb = json.loads(json.dumps(release))
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    folder = course / "submitted" / student / CHAPTER
    folder.mkdir(parents=True)
    (folder / f"{CHAPTER}.ipynb").write_text(json.dumps(nb))


def model_answers(source_nb: dict) -> dict[str, str]:
    """The model answer of every answer cell (code and written), without the markers."""
    answers = {}
    for cell in source_nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            lines = "".join(cell["source"]).split("\n")
            answers[meta["grade_id"]] = "\n".join(line for line in lines if BEGIN not in line and END not in line)
    return answers


def docstrings(answer: str) -> str:
    """The docstrings of the functions in a code answer (the release keeps them), or "" for text."""
    try:
        tree = ast.parse(answer)
    except SyntaxError:
        return ""
    return "\n".join(ast.get_docstring(f, clean=False) or "" for f in tree.body if isinstance(f, ast.FunctionDef))


def scores(course: Path) -> dict:
    """Read nbgrader's own SQLite gradebook through its API, in nbgrader's environment."""
    code = (
        "import json, sys\nfrom nbgrader.api import Gradebook\n"
        "with Gradebook('sqlite:///gradebook.db') as gb:\n"
        "    out = {}\n"
        "    for s in ('right', 'wrong'):\n"
        f"        nb = gb.find_submission_notebook('{CHAPTER}', '{CHAPTER}', s)\n"
        "        out[s] = {'score': nb.score, 'max': nb.max_score, 'code': nb.code_score,\n"
        "                  'max_code': nb.max_code_score,\n"
        "                  'cells': {g.name: [g.score, g.max_score] for g in nb.grades}}\n"
        "json.dump(out, sys.stdout)\n"
    )
    return json.loads(gradebook_script(course, code))


def gradebook_script(course: Path, code: str) -> str:
    """Run ``code`` with nbgrader's Python in the course folder; return what it prints."""
    python = NBGRADER.parent / "python"
    done = subprocess.run([str(python), "-c", code], cwd=course, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def grade_written_answers(course: Path, student: str) -> None:
    """The instructor's manual grading, done through the gradebook: full points for the model answers."""
    code = (
        "from nbgrader.api import Gradebook\n"
        "with Gradebook('sqlite:///gradebook.db') as gb:\n"
        f"    for g in gb.find_submission_notebook('{CHAPTER}', '{CHAPTER}', '{student}').grades:\n"
        "        if g.needs_manual_grade:\n"
        "            g.manual_score = g.max_score\n"
        "    gb.db.commit()\n"
    )
    gradebook_script(course, code)


def failing_output(course: Path, student: str, grade_id: str) -> str:
    """The text of a graded cell's output in the autograded notebook (what the feedback shows)."""
    nb = json.loads((course / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    parts = []
    for out in cell["outputs"]:
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]).strip())
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}")
    return "\n".join(parts)


def test_nbgrader_end_to_end(tmp_path, nbgrader_env):
    start = time.perf_counter()
    course = tmp_path / "course"
    make_course(course, ROOT / "chapters", only=[CHAPTER])
    source_nb = json.loads((course / "source" / CHAPTER / f"{CHAPTER}.ipynb").read_text())
    nbgrader(nbgrader_env, course, "generate_assignment", CHAPTER)

    # No solution text is left in the release: no line of a model answer in the answer cells,
    # and no line found only in model answers anywhere; no marker.
    release_text = (course / "release" / CHAPTER / f"{CHAPTER}.ipynb").read_text()
    release = json.loads(release_text)
    answers = model_answers(source_nb)
    assert len(answers) == 4  # two coding exercises, two written ones
    public = json.dumps(
        [c["source"] for c in source_nb["cells"] if not c["metadata"].get("nbgrader", {}).get("solution")]
    )
    released = {
        c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"])
        for c in release["cells"]
        if "nbgrader" in c["metadata"]
    }
    for grade_id, answer in answers.items():
        for line in answer.split("\n"):
            body = line.strip()
            if body and not body.startswith(("def ", '"""')) and body not in docstrings(answer):
                assert body not in released[grade_id], body
                text = json.dumps(body)[1:-1]
                assert len(text) < 10 or text not in release_text or text in public, body
    assert "SOLUTION" not in release_text and release_text.count("YOUR ANSWER HERE") == 2

    # One student submits the model answers; another one the same code but a causal mask
    # without its diagonal, and leaves the written answers empty.
    assert RIGHT in answers["ex-04-1-code"]
    submit(course, release, answers, "right")
    code = {k: v for k, v in answers.items() if k.endswith("-code")}
    submit(course, release, {**code, "ex-04-1-code": code["ex-04-1-code"].replace(RIGHT, WRONG)}, "wrong")
    nbgrader(nbgrader_env, course, "autograde", CHAPTER, "--create")
    grade_written_answers(course, "right")
    nbgrader(nbgrader_env, course, "generate_feedback", CHAPTER)
    elapsed = time.perf_counter() - start

    got = scores(course)
    total = sum(POINTS[f"ex-04-{k}"] for k in range(1, 5))
    auto = POINTS["ex-04-1"] + POINTS["ex-04-2"]
    assert got["right"]["score"] == got["right"]["max"] == total
    assert got["right"]["code"] == got["right"]["max_code"] == auto
    assert 0 < got["wrong"]["score"] < total and 0 < got["wrong"]["code"] < auto
    assert got["wrong"]["cells"]["ex-04-1-check-1"] == [0, POINTS["ex-04-1"]]
    assert got["wrong"]["cells"]["ex-04-2-check-1"] == [POINTS["ex-04-2"]] * 2

    # The feedback of the wrong answer holds the check's own explanation.
    wrong_mask = lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1)
    explanation = tl.exercises.masking.check_causal_mask(wrong_mask, verbose=False).message
    assert explanation.startswith("Not yet: ")
    feedback = html.unescape((course / "feedback" / "wrong" / CHAPTER / f"{CHAPTER}.html").read_text())
    assert explanation in re.sub(r"<[^>]+>", "", feedback)
    assert explanation not in html.unescape((course / "feedback" / "right" / CHAPTER / f"{CHAPTER}.html").read_text())

    summary = "\n".join(
        [
            "== the release: answer cell ex-04-1-code ==",
            released["ex-04-1-code"].rstrip(),
            f"== the release: test cell ex-04-1-check-1 (locked, {POINTS['ex-04-1']} points) ==",
            released["ex-04-1-check-1"].rstrip(),
            "== the gradebook ==",
            *(
                f"{s}: {got[s]['score']:g} of {got[s]['max']:g} points "
                f"(autograded {got[s]['code']:g} of {got[s]['max_code']:g})"
                for s in ("right", "wrong")
            ),  # fmt: skip
            "== the feedback of wrong, cell ex-04-1-check-1 ==",
            failing_output(course, "wrong", "ex-04-1-check-1"),
        ]
    )
    print(f"\n{summary}\nend to end in {elapsed:.1f} s")
    if os.environ.get("UPDATE_RECORDED") == "1":
        RECORDED.parent.mkdir(exist_ok=True)
        RECORDED.write_text(summary + "\n")
    assert RECORDED.read_text() == summary + "\n"
