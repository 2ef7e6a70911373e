"""Insert (or refresh) the Colab set-up cell at the top of every chapter notebook.

The cell installs ``transformer_lib`` when, and only when, the notebook runs in Google Colab.
It is tagged ``remove-cell`` (hidden in the book) and marked ``NBVAL_SKIP`` (skipped by nbval).

    python scripts/colab_cell.py
"""

import json
import sys
from pathlib import Path

REPO_URL = "https://github.com/attention-executed/attention-executed"
# what the chapters import beyond PyTorch, each at its lower bound or newer (scripts/lower_bounds.txt)
CHAPTER_NEEDS = (
    "numpy",
    "matplotlib",
    "ipywidgets",
    "tqdm",
    "regex",
    "tiktoken",
    "scikit-learn",
    "transformers",
    "peft",
)
LOWER_BOUNDS = Path(__file__).resolve().parent / "lower_bounds.txt"


def requirements() -> list[str]:
    """``["numpy>=1.24.0", ...]``: each of CHAPTER_NEEDS from its pin in scripts/lower_bounds.txt."""
    pins = dict(
        line.strip().split("==") for line in LOWER_BOUNDS.read_text(encoding="utf-8").splitlines() if "==" in line
    )
    missing = [name for name in CHAPTER_NEEDS if name not in pins]
    if missing:
        raise ValueError(f"scripts/lower_bounds.txt pins no release of {missing}")
    return [f"{name}>={pins[name]}" for name in CHAPTER_NEEDS]


NEEDS = ",\n            ".join(f'"{r}"' for r in requirements())
SOURCE = f"""# NBVAL_SKIP
# In Google Colab, install the book's library first; anywhere else this cell
# does nothing.
import sys

if "google.colab" in sys.modules:
    import subprocess
    from importlib.metadata import version

    pip = [sys.executable, "-m", "pip", "install", "-q"]
    # Colab's PyTorch stays as it is; what the chapters need besides, at the
    # book's lower bounds or newer (pip leaves alone a package Colab already
    # has at such a release)
    subprocess.run(
        [
            *pip,
            f"torch=={{version('torch')}}",
            {NEEDS},
        ],
        check=True,
    )
    library = "transformer_lib @ git+{REPO_URL}"
    subprocess.run([*pip, "--no-deps", library], check=True)"""
MARKER = "# NBVAL_SKIP\n# In Google Colab"


def colab_cell(execution_count: int | None = None) -> dict:
    """The cell; ``execution_count`` is the old cell's, so a notebook saved as one clean run stays one."""
    return {
        "cell_type": "code",
        "execution_count": execution_count,
        "id": "colab-setup",
        "metadata": {"tags": ["remove-cell"]},
        "outputs": [],
        "source": SOURCE.splitlines(keepends=True),
    }


def main(paths: list[str]) -> None:
    notebooks = [Path(p) for p in paths] or sorted(Path("chapters").glob("*.ipynb"))
    for path in notebooks:
        nb = json.loads(path.read_text(encoding="utf-8"))
        old = [c for c in nb["cells"] if "".join(c["source"]).startswith(MARKER)]
        cells = [c for c in nb["cells"] if c not in old]
        count = old[0].get("execution_count") if old else None
        nb["cells"] = [colab_cell(count), *cells]
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{path}: Colab cell in place")


if __name__ == "__main__":
    main(sys.argv[1:])
