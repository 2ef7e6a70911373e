"""``import transformer_lib`` has no side effects: it leaves PyTorch's, NumPy's, matplotlib's and
the warnings module's settings as it found them, in a plain interpreter and in a Jupyter kernel,
where the figures a user shows keep their colours until a chapter asks for palette PNGs
(``tl.viz.compact_inline_figures()``)."""

import base64
import io
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# every global setting the library could touch, as one printable value; the third-party packages
# are imported first, so that what their own imports change is not counted
SNAPSHOT = """
import random, warnings, logging, sys
import numpy as np, torch, matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt

def snapshot():
    opts = torch._tensor_str.PRINT_OPTS
    return {
        "torch dtype": torch.get_default_dtype(),
        "torch threads": (torch.get_num_threads(), torch.get_num_interop_threads()),
        "torch print": (opts.precision, opts.threshold, opts.edgeitems, opts.linewidth, opts.sci_mode),
        "torch deterministic": (torch.are_deterministic_algorithms_enabled(),
                                torch.is_deterministic_algorithms_warn_only_enabled()),
        "torch backends": (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
                           torch.get_float32_matmul_precision()),
        "torch grad": torch.is_grad_enabled(),
        "torch random": torch.random.get_rng_state().sum().item(),
        "numpy print": np.get_printoptions(),
        "numpy random": np.random.get_state()[1].sum(),
        "python random": random.getstate(),
        "warnings": list(warnings.filters),
        "logging": (logging.root.level, list(logging.root.handlers)),
        "matplotlib": (dict(matplotlib.rcParams), matplotlib.get_backend(), plt.isinteractive()),
        "displayhook": sys.displayhook,
    }

before = snapshot()
import transformer_lib as tl
import transformer_lib.experiments
assert tl.viz.compact_inline_figures() is False  # no IPython here: nothing to change
after = snapshot()
changed = [k for k in before if before[k] != after[k]]
print("changed:", changed)
"""  # noqa: E501


def test_importing_the_library_changes_no_global_setting():
    done = subprocess.run([sys.executable, "-c", SNAPSHOT], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "changed: []"


def test_the_runpy_warning_is_silenced_only_under_python_m():
    # `python -m transformer_lib.train` would warn that the package already holds the module; the
    # package's filter for it is added only while `python -m` imports the package (sys.argv[0] is
    # then "-m"), and it matches that one message from runpy
    script = "import torch, warnings as w; n = len(w.filters); import transformer_lib; print(len(w.filters) - n)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "0", done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lib.train", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0 and "found in sys.modules" not in done.stderr, done.stderr


# run in a Jupyter kernel: a user's figure of many colours, shown before and after the import,
# after the chapters' call and after the call that undoes it
KERNEL_CELLS = [
    "%matplotlib inline",
    "import matplotlib, numpy as np\n"
    "import matplotlib.pyplot as plt\n"
    "png = get_ipython().display_formatter.formatters['image/png']\n"
    "before = (dict(matplotlib.rcParams), matplotlib.get_backend(), png.lookup)\n"
    "def show():\n"
    "    fig, ax = plt.subplots(figsize=(3, 2))\n"
    "    ax.imshow(np.random.default_rng(0).random((40, 60, 3)))\n"
    "    plt.show()",
    "show()",
    "import transformer_lib as tl\n"
    "import transformer_lib.experiments\n"
    "assert (dict(matplotlib.rcParams), matplotlib.get_backend(), png.lookup) == before",
    "show()",
    "assert tl.viz.compact_inline_figures() is True\nshow()",
    "assert tl.viz.compact_inline_figures(False) is False\n"
    "assert png.lookup == before[2] and 'lookup' not in vars(png)\n"
    "show()",
]


def colours(png: str) -> int:
    from PIL import Image

    picture = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB")
    return len(picture.getcolors(maxcolors=1 << 24))


def test_in_a_kernel_the_users_figures_keep_their_colours_until_a_chapter_asks():
    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        shown = []
        for code in KERNEL_CELLS:
            figures = []
            reply = client.execute_interactive(
                code,
                timeout=120,
                output_hook=lambda msg, figures=figures: figures.extend(
                    [msg["content"]["data"]["image/png"]]
                    if msg["msg_type"] == "display_data" and "image/png" in msg["content"]["data"]
                    else []
                ),
            )
            assert reply["content"]["status"] == "ok", (code, reply["content"].get("traceback"))
            shown += figures
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    counts = [colours(png) for png in shown]
    assert len(counts) == 4, counts
    plain, imported, compact, restored = counts
    assert plain > 1000 and imported == plain and restored == plain, counts  # the user's own colours
    assert compact <= 256, counts  # what the chapters ask for
