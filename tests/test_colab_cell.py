"""The hidden first cell of every chapter, run as Google Colab runs it and as everywhere else does.

In Colab (``google.colab`` imported, as Colab's kernel does at start) the cell must install what the
chapters import, each at the book's lower bound or newer, keep Colab's PyTorch, and install the book's
library with pip, after which ``import transformer_lib`` works. The test runs the cell's
own text, read from a chapter notebook, in a fresh Python with a stand-in ``google.colab``
module; the one change is the repository's address, which points at a clone of this checkout (a ``git+file``
address, so pip clones it with git exactly as it would clone the published repository). The cell
runs in a throwaway virtual environment that sees the book's environment's packages (PyTorch,
NumPy, transformers, ...) as Colab's preinstalled ones, so pip installs only the library, into the
throwaway environment. Anywhere else the cell must do nothing: it starts no process and installs nothing."""

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from colab_cell import CHAPTER_NEEDS, MARKER, REPO_URL, SOURCE, requirements  # noqa: E402

pytestmark = pytest.mark.slow


def _first_cell(chapter: str) -> str:
    nb = json.loads((ROOT / "chapters" / chapter).read_text(encoding="utf-8"))
    return "".join(nb["cells"][0]["source"])


@pytest.fixture(scope="module")
def cell() -> str:
    assert SOURCE.startswith(MARKER) and SOURCE.count(f"git+{REPO_URL}") == 1
    return SOURCE


@pytest.mark.parametrize("chapter", sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb")))
def test_every_chapter_opens_with_the_current_cell(chapter):
    assert _first_cell(chapter) == SOURCE, f"{chapter}: run python scripts/colab_cell.py"


def test_the_cell_asks_for_each_lower_bound():
    pins = dict(
        line.split("==") for line in (ROOT / "scripts" / "lower_bounds.txt").read_text().split() if "==" in line
    )
    assert requirements() == [f"{name}>={pins[name]}" for name in CHAPTER_NEEDS]
    assert "torch" not in CHAPTER_NEEDS


def _run_cell(
    source: str, tmp_path: Path, *, colab: bool, record: bool, python: str = sys.executable
) -> subprocess.CompletedProcess:
    """Run ``source`` in a fresh Python, as a kernel would; with ``colab`` a stand-in ``google.colab``
    is imported first; with ``record`` subprocess.run is replaced by a recorder that prints its calls."""
    fake = tmp_path / "fake_colab"
    (fake / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (fake / "google" / "colab" / "__init__.py").write_text("")
    prelude = "import sys\n"
    if colab:
        prelude += f"sys.path.insert(0, {str(fake)!r})\nimport google.colab\n"
    if record:
        prelude += "import subprocess\ncalls = []\nsubprocess.run = lambda *a, **k: calls.append(a)\n"
    epilogue = "\nprint('calls:', calls)\n" if record else ""
    script = prelude + source + epilogue
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INPUT"] = "1"
    return subprocess.run([python, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_outside_colab_the_cell_does_nothing(cell, tmp_path):
    done = _run_cell(cell, tmp_path, colab=False, record=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "calls: []", done.stdout
    # and with the marker present, the same recorder sees the pip commands: the check above can fail
    done = _run_cell(cell, tmp_path, colab=True, record=True)
    assert "pip" in done.stdout and REPO_URL in done.stdout, done.stdout + done.stderr


def test_in_colab_the_cell_keeps_torch_and_asks_for_the_lower_bounds(cell, tmp_path):
    done = _run_cell(cell, tmp_path, colab=True, record=True)
    assert done.returncode == 0, done.stderr
    needs, library = ast.literal_eval(done.stdout.removeprefix("calls: "))
    needs, library = needs[0], library[0]
    # PyTorch pinned at the release already there, so pip neither upgrades nor replaces it
    assert f"torch=={version('torch')}" in needs
    assert set(requirements()) <= set(needs)
    assert not {"-U", "--upgrade", "--force-reinstall", "--no-deps"} & set(needs)
    assert "--no-deps" in library and library[-1] == f"transformer_lib @ git+{REPO_URL}"


def test_in_colab_the_cell_installs_the_library(cell, tmp_path):
    if not shutil.which("git"):
        pytest.skip("git is needed to install from a git+file address")
    # the repository as Colab would fetch it: a clone of this checkout's committed state
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    source = cell.replace(f"git+{REPO_URL}", f"git+file://localhost{clone}")
    # the throwaway environment, with the book's environment's packages as Colab's preinstalled ones
    venv = tmp_path / "colab-venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site_dir = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site = Path(site_dir)
    (site / "colab_preinstalled.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    assert not (site / "transformer_lib").exists()
    done = _run_cell(source, tmp_path, colab=True, record=False, python=python)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "transformer_lib" / "__init__.py").exists(), sorted(p.name for p in site.iterdir())
    # what was already there at a new enough release is left alone: PyTorch above all
    assert not {"torch", "transformers", "numpy"} & {p.name for p in site.iterdir()}
    check = textwrap.dedent(
        """
        import transformer_lib as tl, torch
        print(tl.__file__)
        out, w = tl.scaled_dot_product_attention(*[torch.ones(1, 3, 4)] * 3, mask=tl.causal_mask(3))
        print(tuple(out.shape), round(w[0, 2].sum().item(), 4))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = subprocess.run([python, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    where, result = shown.stdout.split("\n")[:2]
    assert Path(where).is_relative_to(site), f"imported from {where}, not from what the cell installed"
    assert result == "(1, 3, 4) 1.0"
