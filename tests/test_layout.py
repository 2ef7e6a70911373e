"""Tests of the library's layout: one flat namespace, imports without cycles that follow the
chapters, every public name's docstring naming its chapter by name, the chapters listed once
(transformer_lib/chapters.py) and every list a chapter joins agreeing with it, so that a chapter
inserted changes no file of the library, and the PyTorch range written once."""

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import transformer_lib as tl
from transformer_lib import chapters

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "transformer_lib"

# Concept modules in the order a reader meets them: each may import only the ones before it, and
# never a tool. The library keeps both lists (transformer_lib/__init__.py), the test reads them.
CONCEPTS, TOOLS = list(tl._CONCEPTS), list(tl._TOOLS)
# A module a reader can hold in mind: concept modules stay near one chapter's worth of code, and
# so do the command line's modules (cli/: one per command, the dispatcher and their shared settings).
# The limits are for splitting along a seam a reader sees, never for packing lines to fit: a concept
# may take the lines it needs, and a module past them is split.
MAX_CONCEPT_LINES, MAX_MODULE_LINES = 500, 600
SHORT_PACKAGES = ["cli"]  # tool packages whose modules keep to MAX_CONCEPT_LINES


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path) -> set[str]:
    """The package modules that the file at ``path`` imports, anywhere in it (top level or inside a function)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("transformer_lib"):
                target = node.module.removeprefix("transformer_lib").lstrip(".")
            else:
                continue
            found.add(target)
            found.update(f"{target}.{a.name}".lstrip(".") for a in node.names)  # `from . import x`
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("transformer_lib").lstrip(".") for a in node.names
                         if a.name.startswith("transformer_lib"))  # fmt: skip
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): package_imports(p) for p in PACKAGE.rglob("*.py")}


def top(name: str) -> str:
    return name.split(".")[0]


def test_there_are_no_import_cycles():
    graph = {m: {d for d in deps if d} for m, deps in import_graph().items() if m}  # the package itself aside
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                raise AssertionError(f"import cycle: {' -> '.join([*path, m, d])}")
            if d not in state:
                visit(d, [*path, m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_concept_modules_import_only_earlier_chapters():
    graph = import_graph()
    assert set(CONCEPTS) | set(TOOLS) >= {top(m) for m in graph if m}, "a new module: add it to CONCEPTS or TOOLS"
    for i, module in enumerate(CONCEPTS):
        for dep in {top(d) for d in graph[module]}:
            assert dep not in TOOLS, f"concept module {module} imports the tool module {dep}"
            assert CONCEPTS.index(dep) < i, f"{module} (chapter order {i}) imports the later module {dep}"


def test_the_layering_check_sees_a_bad_import(tmp_path, monkeypatch):
    # the checks above must be able to fail: a concept module importing a tool is reported
    bad = tmp_path / "transformer_lib"
    bad.mkdir()
    (bad / "__init__.py").write_text("")
    (bad / "masks.py").write_text("from .train import train\n")
    (bad / "train.py").write_text("def f():\n    from . import masks\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", bad)
    assert import_graph()["masks"] == {"train", "train.train"} - {"train.train"}
    with pytest.raises(AssertionError, match="import cycle"):
        test_there_are_no_import_cycles()


def run_fresh(script: str) -> str:
    """Run ``script`` in a fresh interpreter from the repository root; its output, or the last line of its error."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
    return done.stdout


@pytest.mark.slow  # a Python process per module
def test_every_module_imports_first_without_a_circular_import():
    # A module imported first pulls in its parent packages and their imports: a cycle through a
    # package's __init__ only shows at run time, so import each module first in a fresh namespace.
    names = sorted(m for m in import_graph() if m)
    script = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for key in [k for k in sys.modules if k.split('.')[0] == 'transformer_lib']:\n"
        "        del sys.modules[key]\n"
        "    if not name.endswith('__main__'):\n"
        "        importlib.import_module('transformer_lib.' + name)\n"
    )
    run_fresh(script)


def test_flat_namespace_has_every_public_name_of_every_module():
    for module in ["attention", "masks", "kv_cache", "multihead", "positional", "blocks", "encoder_decoder",
                   "sampling", "models", "long_context", "cost", "data", "pretrained", "train_config", "train",
                   "checkpoint", "utils", "viz", "inspect_heads", "induction", "bpe", "tokens"]:  # fmt: skip
        names = __import__(f"transformer_lib.{module}", fromlist=["__all__"]).__all__
        missing = [n for n in names if n not in tl.__all__]
        assert not missing, f"{module} names missing from transformer_lib.__all__: {missing}"
    assert all(hasattr(tl, n) for n in tl.__all__)
    assert len(tl.__all__) == len(set(tl.__all__))


def test_no_two_modules_export_one_name():
    owner: dict[str, str] = {}
    for module in tl._MODULES:
        for name in __import__(f"transformer_lib.{module}", fromlist=["__all__"]).__all__:
            assert name not in owner, f"{name} is exported by both {owner[name]} and {module}"
            owner[name] = module


def test_modules_stay_short():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        limit = MAX_CONCEPT_LINES if top(module_name(path)) in CONCEPTS + SHORT_PACKAGES else MAX_MODULE_LINES
        if lines > limit:
            too_long.append(f"{path.relative_to(PACKAGE)}: {lines} lines (at most {limit})")
    assert not too_long, "modules to split: " + "; ".join(too_long)


def test_importing_the_package_loads_no_command_line_trainer_or_plotting():
    # PyTorch itself may import argparse and tqdm: import it first, then make those modules
    # unimportable, so that any import of them by the package fails here
    script = (
        "import sys, torch\n"
        "banned = ['argparse', 'tqdm', 'matplotlib', 'matplotlib.pyplot']\n"
        "for name in banned:\n"
        "    sys.modules[name] = None\n"
        "import transformer_lib as tl\n"
        "assert callable(tl.viz.frame_widget) and tl.PRESETS and tl.TrainConfig\n"
        "loaded = [m for m in ('transformer_lib.cli', 'transformer_lib.student') if m in sys.modules]\n"
        "print(' '.join(loaded))\n"
    )
    loaded = run_fresh(script).split()
    assert loaded == [], f"import transformer_lib loaded {loaded}"


def _notebook_title(notebook: Path) -> str:
    """A chapter's title, its notebook's first heading, as plain text ($\\sqrt{d_k}$ as sqrt(d_k))."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = next(t for c in cells if c["cell_type"] == "markdown" and (t := "".join(c["source"])).startswith("# "))
    title = text.splitlines()[0].removeprefix("# ").strip()
    return re.sub(r"\$\\sqrt\{([^}]*)\}\$", r"sqrt(\1)", title)


def toc_notebooks(root: Path = ROOT) -> list[str]:
    """The chapters' notebooks in the table of contents (``_toc.yml``), in its order: ``NN_slug``."""
    return re.findall(r"^\s*- file: chapters/(\d\d_\w+)\s*$", (root / "_toc.yml").read_text(), flags=re.M)


CHAPTER_TITLES = {c.title for c in chapters.CHAPTERS}
#: Modules being rewritten as this is written, whose docstrings still name chapters by number
#: until ``python scripts/name_chapters.py FILE ...`` is run on them; then this is empty again.
NOT_YET_NAMED: set[str] = set()


def test_the_chapters_are_listed_once_in_the_order_of_the_table_of_contents():
    # transformer_lib/chapters.py is the one list: the table of contents, the notebooks' file names
    # and their first headings agree with it; numbers appear only in the file names
    listed = [c.slug for c in chapters.CHAPTERS]
    assert [name[3:] for name in toc_notebooks()] == listed, "chapters.CHAPTERS and _toc.yml disagree"
    notebooks = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert [nb.stem[3:] for nb in notebooks] == listed, "the notebooks' file names and chapters.CHAPTERS disagree"
    assert [nb.stem for nb in notebooks] == toc_notebooks()
    assert [_notebook_title(nb) for nb in notebooks] == [c.title for c in chapters.CHAPTERS]
    assert set(chapters.OLD_NAMES.values()) <= set(listed)
    assert chapters.slug("ch14") == chapters.slug("todays_block") == "todays_block"
    with pytest.raises(ValueError, match="no chapter is called 'ch99'"):
        chapters.slug("ch99")


def test_every_public_function_and_class_names_its_chapter_by_name():
    missing, numbered = [], []
    for name in tl.__all__:
        obj = getattr(tl, name)
        if not callable(obj) or isinstance(obj, type(tl)):
            continue  # constants and modules
        doc = " ".join((obj.__doc__ or "").split())
        named = set()
        for names in re.findall(r'\b[Cc]hapters? ((?:"[^"]+"(?:,? and |, | to )?)+)', doc):
            named |= set(re.findall(r'"([^"]+)"', names))
        if named - CHAPTER_TITLES:
            missing.append(f"{name} names {sorted(named - CHAPTER_TITLES)}, which is no chapter's title")
        owner = getattr(obj, "__module__", "").removeprefix("transformer_lib.")
        by_number = re.search(r"\b[Cc]hapters? \d", doc)
        if by_number and owner not in NOT_YET_NAMED:
            numbered.append(name)
        if not named & CHAPTER_TITLES and not (by_number and owner in NOT_YET_NAMED):
            missing.append(name)
    assert not missing, f"docstrings that do not say by name which chapter introduces them: {missing}"
    assert not numbered, f"docstrings that name a chapter by its number, which moves: {numbered}"


def chapter_modules(package: str) -> list[str]:
    """The modules of ``transformer_lib.<package>`` other than its machinery (``_core``, ``recorder``)."""
    machinery = ("__init__", "__main__", "_core", "recorder")
    return sorted(p.stem for p in (PACKAGE / package).glob("*.py") if p.stem not in machinery)


def test_every_list_a_chapter_joins_agrees_with_the_one_list():
    # A new chapter joins these lists by its slug alone; none is kept by hand in chapter numbers.
    from transformer_lib.experiments import RECORDS, record_path

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import api_pages
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    slugs = [c.slug for c in chapters.CHAPTERS]

    def owner(module: str) -> str | None:  # the chapter a module is named after: its slug, or slug_suffix
        return next(
            (s for s in sorted(slugs, key=len, reverse=True) if module == s or module.startswith(s + "_")), None
        )

    # exercise checks: one module per chapter, named by its slug
    assert chapter_modules("exercises") == sorted(slugs), "each chapter has transformer_lib/exercises/<slug>.py"
    # recorded experiments: a module and a record per chapter that has one, by slug, in the book's order
    experiments = chapter_modules("experiments")
    assert all(owner(m) for m in experiments), f"experiment modules not named by a chapter: {experiments}"
    assert list(RECORDS) == [s for s in slugs if s in RECORDS], "RECORDS is in the book's order"
    assert set(RECORDS) <= set(experiments) and all(record_path(s).is_file() for s in RECORDS)
    # the data folders: each is a chapter's, by its slug or its old name
    folders = [p.name for p in (PACKAGE / "data").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert all(f in slugs or f in chapters.OLD_NAMES for f in folders), folders
    assert all(chapters.data_folder(f).name == f for f in folders)
    # the package data: patterns that name no chapter, so that every folder's files install
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r'"(?:ch\d\d|' + "|".join(slugs) + r")/", pyproject), "package-data names a chapter's folder"
    # the API pages: the experiments and exercises pages list every chapter's module
    documented = api_pages.documented_modules()
    for package in ("experiments", "exercises"):
        missing = [m for m in chapter_modules(package) if f"transformer_lib.{package}.{m}" not in documented]
        assert not missing, f"modules with no API page: {missing}"
    for _, _, named, _ in api_pages.PAGES:
        assert named in api_pages.SPECIAL or set(named.split()) - {"to"} <= set(slugs), named
    # the course's points: by slug, in the book's order, and the labels the notebooks use follow it
    from transformer_lib.student.nbgrader import CHAPTER_POINTS, POINTS

    assert list(CHAPTER_POINTS) == [s for s in slugs if s in CHAPTER_POINTS], "CHAPTER_POINTS by slug, in order"
    assert sum(map(len, CHAPTER_POINTS.values())) == len(POINTS)
    # the README's table of chapters: the titles in the book's order
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| \d+ \| ([^|]+) \|", readme, flags=re.M)
    assert [r.strip() for r in rows] == [c.title for c in chapters.CHAPTERS], "README's table of chapters"


# Where the library may still write an old name by number (``ch14``): the modules that document
# the old names as aliases, and a data folder's path (``data/ch14``), which keeps its name.
OLD_NAME_ALLOWED = {"chapters.py", "exercises/__init__.py", "experiments/__init__.py", "experiments/recorder.py"}
DATA_FOLDER = re.compile(r"""data/ch\d\d/|["']data["'] / ["']ch\d\d["']""")


def numbered_references(package: Path, notebooks: list[str]) -> list[str]:
    """Every place in the library's files under ``package`` that would move when a chapter is
    inserted: a chapter by number ("chapter 14", "chapters 2-3"), a module or record by its old
    name outside :data:`OLD_NAME_ALLOWED` and the data folders' paths, and a notebook's file name
    (``notebooks``: ``14_todays_block``) outside ``exercises/__init__.py``, whose
    ``module_for`` takes one."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if module_name(path).removesuffix(".__init__") in NOT_YET_NAMED:
            continue
        text = DATA_FOLDER.sub("", path.read_text(encoding="utf-8"))
        for number, line in enumerate(text.splitlines(), 1):
            hits = re.findall(r"\b[Cc]hapters? \d+\b(?!_)", line)
            if where not in OLD_NAME_ALLOWED:
                hits += re.findall(r"\bch\d\d\b", line)
            if where != "exercises/__init__.py":
                hits += [n for n in notebooks if n in line]
            found += [f"{where}:{number}: {hit}" for hit in hits]
    return found


def test_no_library_file_names_a_chapter_by_its_number():
    notebooks = [p.stem for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")]
    found = numbered_references(PACKAGE, notebooks)
    assert not found, f"the library names chapters by number, which an inserted chapter changes: {found}"


def test_a_trial_insertion_changes_no_library_file(tmp_path):
    # Insert a chapter before "Today's block" in a copy of the book's frame: its notebook and the
    # later ones are renumbered, and the table of contents follows. Nothing in the library names
    # the old file names or numbers, so its files stay as they are; the one list gains a line.
    slugs = [c.slug for c in chapters.CHAPTERS]
    at = slugs.index("todays_block")
    new_order = [*slugs[:at], "inserted", *slugs[at:]]
    renamed = {f"{i + 1:02d}_{s}": f"{new_order.index(s) + 1:02d}_{s}" for i, s in enumerate(slugs)}
    assert renamed["14_todays_block"] == "15_todays_block" and renamed["13_tokens"] == "13_tokens"
    toc = (ROOT / "_toc.yml").read_text()
    for old, new in sorted(renamed.items(), reverse=True):
        toc = toc.replace(f"chapters/{old}\n", f"chapters/{new}\n")
    toc = toc.replace("chapters/15_todays_block\n", "chapters/14_inserted\n      - file: chapters/15_todays_block\n")
    (tmp_path / "_toc.yml").write_text(toc)
    after = toc_notebooks(tmp_path)
    assert after[at] == "14_inserted" and after[at + 1] == "15_todays_block" and len(after) == len(slugs) + 1
    moved = [old for old, new in renamed.items() if old != new]
    assert "14_todays_block" in moved and "20_experts" in moved
    # what the library would have to change: every mention of a moved notebook or of a number
    assert numbered_references(PACKAGE, moved) == []
    # the library finds each chapter's modules by its slug, whatever the file's number
    from transformer_lib import exercises

    assert exercises.module_for("15_todays_block.ipynb") == exercises.module_for("14_todays_block.ipynb")


# a shape as the docstrings write it: "(B, T, d_model)", "(..., T_q, T_k)", "(N,)"
SHAPE = re.compile(r"\((?:B|N|\.\.\.)\b[^()]*\)|\(\.\.\.,[^()]*\)")


def public_modules_classes() -> dict[str, type]:
    """Every class that a public module of the package (the flat namespace, ``exercises``,
    ``student``) lists in its ``__all__``, by its qualified name."""
    found = {}
    for info in pkgutil.walk_packages(tl.__path__, "transformer_lib."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if isinstance(obj, type):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_public_modules_forward_says_its_shapes():
    import torch

    classes = {n: c for n, c in public_modules_classes().items() if issubclass(c, torch.nn.Module)}
    assert "transformer_lib.multihead.MultiHeadAttention" in classes and len(classes) >= 14
    missing = [n for n, c in classes.items() if not SHAPE.search(c.forward.__doc__ or "")]
    assert not missing, f"forward methods whose docstring (help()) gives no shape in and out: {missing}"
    assert SHAPE.search("``query (B, T_q, d_model)``") and SHAPE.search("(..., T_q, d_v)")
    assert not SHAPE.search("Returns the output.")


def torch_range(text: str) -> str:
    found = re.findall(r"torch\s*(>=[^\"'\s]+)", text)
    assert found, "no torch requirement"
    return found[0].rstrip(",")


def test_the_pytorch_range_is_written_once_and_binder_agrees():
    pyproject = (ROOT / "pyproject.toml").read_text()
    written = torch_range(pyproject)
    upper = re.search(r"<(\d+)\.(\d+)", written)
    assert upper and (int(upper[1]), int(upper[2])) <= (2, 14), (
        f"the range must admit nothing newer than 2.13: {written}"
    )
    assert torch_range((ROOT / "binder" / "requirements.txt").read_text()) == written
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "torch>=" not in setup and "torch>=" not in (ROOT / "requirements.txt").read_text()


# The reference pages print a docstring's code blocks (after "::", and ">>>" lines) in a fixed-width
# font: at 1280 px a line longer than this scrolls sideways (the browser tests measure the page; this
# catches it without building the book).
MAX_CODE_BLOCK_CHARS = 77


def docstring_code_lines(doc: str) -> list[str]:
    lines, code, i = doc.expandtabs().splitlines(), [], 0
    while i < len(lines):
        if lines[i].rstrip().endswith("::"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                code.append(lines[i].strip())
                i += 1
        else:
            if lines[i].lstrip().startswith(">>>"):
                code.append(lines[i].strip())
            i += 1
    return code


def test_docstring_code_lines_fit_the_reference_page():
    too_wide = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                too_wide += [f"{path.relative_to(PACKAGE)}: {line!r} ({len(line)} characters)"
                             for line in docstring_code_lines(ast.get_docstring(node) or "")
                             if len(line) > MAX_CODE_BLOCK_CHARS]  # fmt: skip
    assert not too_wide, f"code lines wider than {MAX_CODE_BLOCK_CHARS} characters: {too_wide}"


def test_the_code_line_check_finds_a_literal_block_and_a_doctest():
    doc = "Run it::\n\n    python -m x --flag\n    second line\n\nprose after\n>>> f(1)\n"
    assert docstring_code_lines(doc) == ["", "python -m x --flag", "second line", "", ">>> f(1)"]
