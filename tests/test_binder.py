"""Binder's environment, built as Binder builds it, runs the first chapter and a training chapter.

Binder (repo2docker) installs ``binder/requirements.txt`` with pip into a fresh environment of the
Python of ``binder/runtime.txt``, then runs ``binder/postBuild`` from the repository's root. This
test does the same in a throwaway virtual environment, in a copy of the repository, with one
difference: the ``--extra-index-url`` line, which points at PyTorch's own index for its CPU
build, is left out, because CI has no network but the package registry. PyTorch then comes from
pip's configured indexes (on CI, the machine's wheel store holds the CPU build), and the test
checks that what was installed is a CPU build, as on Binder. Every other line is installed as
written.

Then chapter "Why attention?" and chapter "Encoder-decoder and cross-attention" (which trains a small translation model)
run top to bottom in a kernel of that environment (executed by nbconvert; any error fails the test), after a probe
notebook shows that the kernel is the new environment's Python and imports the library from the
copy, as postBuild installed it.

It takes minutes, so the README's test command skips it; ``.ci/run`` runs it as its last step,
with ``BINDER_TEST=1``."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ["01_why_attention.ipynb", "08_encoder_decoder.ipynb"]
TIMINGS: dict[str, float] = {}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("BINDER_TEST") != "1", reason="builds Binder's environment (minutes): set BINDER_TEST=1"
    ),
]


def _sh(args, *, cwd, env, timeout=1500, what=""):
    start = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if what:
        TIMINGS[what] = round(time.perf_counter() - start, 1)
    assert done.returncode == 0, f"{what or args}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def binder(tmp_path_factory, request):
    work = tmp_path_factory.mktemp("binder")
    repo = work / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    # the Python of runtime.txt, as Binder picks it
    runtime = (repo / "binder" / "runtime.txt").read_text().strip()
    version = re.fullmatch(r"python-(\d+\.\d+)", runtime).group(1)
    python = shutil.which(f"python{version}")
    if not python:
        pytest.fail(f"binder/runtime.txt asks for Python {version}; no python{version} on this machine")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = work / "venv"
    _sh([python, "-m", "venv", str(venv)], cwd=work, env=env, what="create the virtual environment")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"  # postBuild's "python" is the environment's
    # binder/requirements.txt less its PyTorch index line (network), every other line as written
    lines = (repo / "binder" / "requirements.txt").read_text().splitlines()
    index = [line for line in lines if line.startswith("--extra-index-url")]
    assert len(index) == 1 and "download.pytorch.org" in index[0], index
    requirements = work / "requirements.txt"
    requirements.write_text("\n".join(line for line in lines if line not in index) + "\n")
    _sh(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(requirements)],
        cwd=repo,
        env=env,
        what="pip install binder/requirements.txt",
    )
    _sh(["bash", "binder/postBuild"], cwd=repo, env=env, what="binder/postBuild")
    # a kernel of that environment, known only to this test's Jupyter folders
    jupyter = work / "jupyter"
    _sh(
        [str(venv / "bin" / "python"), "-m", "ipykernel", "install", "--prefix", str(jupyter), "--name", "binder"],
        cwd=work,
        env=env,
    )
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run_env.update(JUPYTER_PATH=str(jupyter / "share" / "jupyter"), PYTHONHASHSEED="0", OMP_WAIT_POLICY="PASSIVE")
    run_env["JUPYTER_DATA_DIR"] = str(work / "jupyter-data")
    yield repo, venv, run_env
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter and TIMINGS:
        with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            reporter.write_line(
                "\nBinder's environment:\n" + "\n".join(f"  {s:7.1f} s  {w}" for w, s in TIMINGS.items())
            )


def _execute(repo, env, notebook: Path, what: str) -> dict:
    """Run ``notebook`` in the Binder kernel (nbconvert from the book's environment); return it executed."""
    out = notebook.with_name(notebook.stem + "_executed.ipynb")
    _sh(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", str(notebook)]
        + ["--ExecutePreprocessor.kernel_name=binder", "--ExecutePreprocessor.timeout=900", f"--output={out.name}"],
        cwd=notebook.parent,
        env=env,
        what=what,
    )
    return json.loads(out.read_text())


def test_the_kernel_is_binders_environment(binder):
    repo, venv, env = binder
    probe = repo / "probe.ipynb"
    code = "import sys, torch, transformer_lib\n"
    code += "print(sys.prefix)\nprint(transformer_lib.__file__)\nprint(torch.version.cuda)"
    cell = {"cell_type": "code", "execution_count": None, "id": "probe", "metadata": {}, "outputs": [], "source": code}
    nb = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    probe.write_text(json.dumps(nb))
    text = _execute(repo, env, probe, "probe")["cells"][0]["outputs"][0]["text"]
    prefix, library, cuda = "".join(text).split()
    assert Path(prefix) == venv, f"the kernel runs {prefix}, not Binder's environment"
    assert Path(library).is_relative_to(repo), f"transformer_lib imported from {library}, not the repository"
    assert cuda == "None", f"PyTorch was installed with CUDA {cuda}; Binder installs the CPU build"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_in_binders_environment(binder, chapter):
    repo, _, env = binder
    nb = _execute(repo, env, repo / "chapters" / chapter, f"run {chapter}")
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in errors if o["output_type"] == "error"]
    assert not errors, errors
    assert all(c["execution_count"] for c in nb["cells"] if c["cell_type"] == "code"), "a cell did not run"
