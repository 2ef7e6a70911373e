"""Checks of the repository's own configuration: CI workflow, Binder, table of contents."""

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_workflows_match_the_github_schema():
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    assert workflows
    result = subprocess.run(
        [exe, "--builtin-schema", "vendor.github-workflows", *workflows], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflow_runs_the_same_steps_as_ci():
    text = (ROOT / ".github" / "workflows" / "book.yml").read_text()
    assert "bash .ci/run" in text
    ci = (ROOT / ".ci" / "run").read_text()
    steps = ["scripts/test.sh", "scripts/test_other_kernels.sh", "scripts/build_book.sh", "scripts/browser_test.sh",
             "scripts/build_pdf.sh", "tests/pdf", "BINDER_TEST=1"]  # fmt: skip
    assert [step for step in steps if step not in ci] == []
    assert ci.index("scripts/test.sh") < ci.index("scripts/test_other_kernels.sh"), "the second pass needs .venv"


def test_the_second_pass_runs_every_notebook_and_the_tight_tests_with_other_cpu_kernels():
    second = (ROOT / "scripts" / "test_other_kernels.sh").read_text()
    assert "ATEN_CPU_CAPABILITY" in second and "MKL_CBWR" in second
    assert "--nbval " in second and "--nbval-lax" not in second
    assert '-m "not slow" tests chapters instructors.ipynb' in second
    assert '-m "slow and cpu_rounding" tests' in second


def test_every_re_run_of_a_recorded_training_is_run_again_with_other_cpu_kernels():
    # the slow tests of the records re-train seed 0 in float32 or float64 and compare: each is
    # marked cpu_rounding, which the second pass selects
    unmarked = []
    for path in sorted((ROOT / "tests").glob("test_recorded_*.py")):
        module = importlib.import_module(path.stem)
        for name, test in vars(module).items():
            marks = {m.name for m in getattr(test, "pytestmark", [])}
            if name.startswith("test_") and "slow" in marks and "cpu_rounding" not in marks:
                unmarked.append(f"{path.name}::{name}")
    assert not unmarked


def test_binder_installs_the_cpu_build_of_torch():
    req = (ROOT / "binder" / "requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in req and "torch>=" in req
    assert "pip install --no-deps -e ." in (ROOT / "binder" / "postBuild").read_text()


def _toc_files(node):
    if isinstance(node, dict):
        if "file" in node:
            yield node["file"]
        for value in node.values():
            yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


def test_every_chapter_is_in_the_table_of_contents():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = set(_toc_files(toc))
    for nb in (ROOT / "chapters").glob("*.ipynb"):
        assert f"chapters/{nb.stem}" in listed, f"{nb.name} is missing from _toc.yml"
    for entry in listed | {toc["root"]}:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), entry


@pytest.mark.parametrize(("name", "file"), [("torch", "pyproject.toml"), ("jupyter-book", "requirements.txt")])
def test_requirements_bound_the_big_dependencies(name, file):
    lines = [line.strip(' ",') for line in (ROOT / file).read_text().splitlines() if line.strip(' "').startswith(name)]
    assert lines and "<" in lines[0], f"{name} needs an upper bound"


@pytest.mark.parametrize("notebook", sorted((ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_opens_with_the_colab_setup_cell(notebook):
    """The first cell installs the library only in Colab; the book hides it and nbval skips it."""
    first = json.loads(notebook.read_text(encoding="utf-8"))["cells"][0]
    source = "".join(first["source"])
    assert first["cell_type"] == "code"
    assert source.startswith("# NBVAL_SKIP") and '"google.colab" in sys.modules' in source
    assert "remove-cell" in first["metadata"].get("tags", [])


@pytest.mark.parametrize(
    "notebook", [*sorted((ROOT / "chapters").glob("*.ipynb")), ROOT / "instructors.ipynb"], ids=lambda p: p.stem
)
def test_notebook_carries_no_merge_tool_metadata(notebook):
    """A notebook merged with nbdime must not keep its conflict records in the saved file."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    leftovers = [i for i, cell in enumerate(cells) if "nbdime-conflicts" in cell.get("metadata", {})]
    assert not leftovers, f"{notebook.name}: cells {leftovers} still hold nbdime-conflicts metadata"


@pytest.mark.slow  # collects the whole suite in a process of its own
def test_python_m_pytest_from_the_root_collects_every_test():
    """``python -m pytest`` from the repository root: every test file imports (tests/ and
    tests/browser/ each have a conftest, so no test imports from ``conftest`` by name)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "tests/test_long_context.py::" in done.stdout and "tests/test_models.py::" in done.stdout
    files = (ROOT / "tests").rglob("*.py")
    importing = [f.name for f in files if re.search(r"^from conftest import", f.read_text(), re.M)]
    assert not importing, f"import shared test helpers from a uniquely named module (tests/_gpu.py): {importing}"


def test_below_python_3_11_the_test_command_skips_the_instructors_environment(tmp_path):
    """The README promises Python 3.10; nbgrader needs 3.11: scripts/test.sh then skips that
    environment with a message, and NBGRADER_REQUIRED stays unset (tests/test_nbgrader.py skips)."""
    fake = tmp_path / "python3.10"
    fake.write_text('#!/bin/sh\necho "3 10"\n')  # what the version query prints under Python 3.10
    fake.chmod(0o755)
    script = f'source {ROOT / "scripts" / "instructors_env.sh"}; echo "required=${{NBGRADER_REQUIRED:-}}"'
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_REQUIRED"}
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**env, "PYTHON": str(fake)},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "required=" and "Python 3.10" in done.stderr and "3.11" in done.stderr
    assert not (tmp_path / ".venv-instructors").exists()
    assert "source scripts/instructors_env.sh" in (ROOT / "scripts" / "test.sh").read_text()


def test_the_workflow_tests_the_oldest_python_the_readme_promises_and_the_newest():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    versions = workflow["jobs"]["python-versions"]["strategy"]["matrix"]["python-version"]
    oldest = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"Python {oldest} or newer" in (ROOT / "README.md").read_text()
    as_tuple = [tuple(map(int, v.split("."))) for v in versions]
    assert versions[as_tuple.index(min(as_tuple))] == oldest and max(as_tuple) > (3, 11)
    assert "bash scripts/test.sh" in str(workflow["jobs"]["python-versions"]["steps"])


def _fake_tools(folder: Path, tools: dict[str, str]) -> Path:
    """A folder of stand-in programs (name: shell body), with grep, for a PATH of them only."""
    folder.mkdir()
    for name, body in tools.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    (folder / "grep").symlink_to(shutil.which("grep"))
    return folder


KPSEWHICH_WITHOUT = '[ "$1" = "{sty}" ] && exit 1; echo /texmf/"$1"'
# (the stand-in tools, the lines build_pdf.sh's check must print: one per missing thing)
TEX_CASES = {
    "everything there": (
        {"xelatex": "", "latexmk": "", "kpsewhich": "echo /texmf/$1", "fc-list": "echo FreeSerif", "pdftotext": ""},
        [],
    ),
    "XeLaTeX there, a LaTeX package missing": (
        {"xelatex": "", "latexmk": "", "kpsewhich": KPSEWHICH_WITHOUT.format(sty="bbm.sty"),
         "fc-list": "echo FreeSerif", "pdftotext": ""},
        ["the LaTeX package bbm (bbm.sty"],
    ),
    "XeLaTeX there, the font missing": (
        {"xelatex": "", "latexmk": "", "kpsewhich": "echo /texmf/$1", "fc-list": "echo DejaVuSans", "pdftotext": ""},
        ["the font FreeSerif (Debian/Ubuntu: fonts-freefont-otf)"],
    ),
    "XeLaTeX there, pdftotext missing": (
        {"xelatex": "", "latexmk": "", "kpsewhich": "echo /texmf/$1", "fc-list": "echo FreeSerif"},
        ["the program pdftotext"],
    ),
    "no TeX at all": (
        {"fc-list": "echo FreeSerif", "pdftotext": ""},
        ["the program xelatex", "the program latexmk"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", TEX_CASES)
def test_the_pdf_build_names_what_is_missing(case, tmp_path):
    tools, expected = TEX_CASES[case]
    folder = _fake_tools(tmp_path / "bin", tools)
    script = f"set -euo pipefail; source {ROOT / 'scripts' / 'tex_check.sh'}; missing_tex"
    done = subprocess.run([shutil.which("bash"), "-c", script], env={"PATH": str(folder)},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(expected), lines
    assert all(line.startswith(e) for line, e in zip(lines, expected, strict=True)), lines
    assert "source scripts/tex_check.sh" in (ROOT / "scripts" / "build_pdf.sh").read_text()


def test_every_shipped_data_file_is_package_data():
    # a record or checkpoint a chapter reads must be installed by a non-editable install (Colab, Binder)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = ROOT / "transformer_lib" / "data"
    shipped = [p for p in data.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert shipped
    missing = [
        str(p.relative_to(data))
        for p in shipped
        if not any(p.relative_to(data).match(pattern) for pattern in patterns["transformer_lib.data"])
    ]
    assert not missing, f"not in pyproject.toml's package-data: {missing}"
