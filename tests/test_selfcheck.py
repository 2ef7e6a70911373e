"""The self-check extension (_ext/selfcheck.py and its selfcheck.js): normalisation, hashing, the
build (answers read from glued outputs, a missing key fails) and no right answer in the page."""

import json
import os
import random
import re
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))

import selfcheck as sc  # noqa: E402

JS = ROOT / "_ext" / "static" / "selfcheck.js"


# ---- normalisation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "expected"),
    [("4096", "4096"), ("4,096", "4096"), ("4 096", "4096"), ("4096.0", "4096"), ("4.096e3", "4096"), ("-0", "0")],
)
def test_exact_numbers_have_one_spelling(typed, expected):
    assert sc.round_number(typed) == expected


def test_an_inexact_number_is_not_the_integer():
    assert sc.round_number("4096.5") != sc.round_number(4096)


@pytest.mark.parametrize(
    ("value", "sig", "expected"),
    [
        (3.14159, 3, "3.14"),
        (0.0123456, 3, "0.0123"),
        (2.5, 1, "3"),
        (-2.5, 1, "-3"),
        (99.96, 3, "100"),
        (123456, 2, "120000"),
    ],
)
def test_significant_digits_round_half_up(value, sig, expected):
    assert sc.round_number(value, sig=sig) == expected


def test_rounding_grid_accepts_every_spelling_of_a_rounded_value():
    """Any input within half a unit of the last digit normalises to the same text, and only those."""
    rng = random.Random(0)
    for _ in range(500):
        true = rng.uniform(-1000, 1000)
        right = sc.round_number(true, sig=3)
        step = Decimal(1).scaleb(Decimal(repr(true)).adjusted() - 2)
        typed = Decimal(right) + step * Decimal(rng.uniform(-0.49, 0.49)).quantize(Decimal("0.001"))
        assert sc.round_number(str(typed), sig=3) == right
        assert sc.round_number(str(Decimal(right) + step), sig=3) != right


def test_shapes_ignore_spacing_brackets_case_and_symbols():
    symbols = sc.parse_symbols("B=2, h=4, T_q=5, T_k=6")
    right = sc.normalise_shape((2, 4, 5, 6))
    for typed in [
        "(2, 4, 5, 6)",
        "[2,4,5,6]",
        "torch.Size([2, 4, 5, 6])",
        "(B, h, T_q, T_k)",
        "(b,H,t_q,T_{k})",
        "2 x 4 x 5 x 6",
    ]:
        assert sc.normalise_shape(typed, symbols) == right, typed
    assert sc.normalise_shape("(B, T_q, T_k)", symbols) != right
    assert sc.normalise_shape("(5,)") == sc.normalise_shape((5,))


def test_clashing_or_malformed_symbols_are_refused():
    with pytest.raises(sc.SelfCheckError, match="clashes"):
        sc.parse_symbols("T=5, t=6")
    with pytest.raises(sc.SelfCheckError, match="NAME=SIZE"):
        sc.parse_symbols("B")


def test_hash_is_salted_and_the_solution_round_trips():
    a, b = sc.make_salt("chapters/a", "q1"), sc.make_salt("chapters/b", "q1")
    assert a != b and sc.digest(a, "42") != sc.digest(b, "42")
    html = "<p>The answer is 42 \u2014 <em>twice</em> 21.</p>"
    encoded = sc.encode_solution(a, html)
    assert "42" not in encoded and sc.decode_solution(a, encoded) == html


def _spec(kind="number", glue="k", entries=(), **kw):
    return {"kind": kind, "answer_glue": glue, "entries": list(entries), **kw}


def test_build_question_checks_its_input():
    values = {"k": 8320, "shape": (2, 5, 16), "pick": "yes", "half": 0.5}
    q = sc.build_question(_spec(entries=[("wrong", "8192 :: You left out the biases.")]), values, "d", "q")
    assert q["data"]["right"] == sc.digest(q["data"]["salt"], "8320")
    assert q["data"]["wrong"] == [[sc.digest(q["data"]["salt"], "8192"), "You left out the biases."]]
    assert "8320" not in json.dumps(q["data"])
    with pytest.raises(sc.SelfCheckError, match="no glued value 'nope'"):
        sc.build_question(_spec(glue="nope"), values, "d", "q")
    with pytest.raises(sc.SelfCheckError, match="is the right answer"):
        sc.build_question(_spec(entries=[("wrong", "8,320 :: x")]), values, "d", "q")
    with pytest.raises(sc.SelfCheckError, match="not an integer"):
        sc.build_question(_spec(glue="half"), values, "d", "q")
    with pytest.raises(sc.SelfCheckError, match="none of the options"):
        sc.build_question(_spec("choice", "pick", [("option", "no"), ("option", "maybe")]), values, "d", "q")
    with pytest.raises(sc.SelfCheckError, match="ANSWER :: HINT"):
        sc.build_question(_spec(entries=[("wrong", "8192")]), values, "d", "q")
    shape = sc.build_question(_spec("shape", "shape", [("wrong", "(B, T) :: x")], symbols="B=2, T=5"), values, "d", "q")
    assert shape["answer_text"] == "(2, 5, 16)"


# ---- the browser's normalisation is the same as Python's ------------------------------------


def _node():
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        pytest.skip("Node.js not found: the JavaScript side is checked by the browser test only")
    return node


def test_javascript_normalises_and_hashes_like_python():
    rng = random.Random(1)
    cases = []
    for _ in range(300):
        x = rng.choice([rng.uniform(-1e4, 1e4), rng.randint(-(10**7), 10**7), rng.uniform(0, 1e-3)])
        typed = rng.choice([repr(x), f"{x:.6g}", f"{x:,.4f}", f"{x:.3e}"])
        rules = rng.choice(
            [{"kind": "number", "sig": rng.randint(1, 5)}, {"kind": "number", "decimals": rng.randint(0, 4)}]
        )
        cases.append([rules, typed])
    cases += [[{"kind": "number"}, t] for t in ["4,096", "4096.0", "4.096e3", "1e-3", ".5", "-0.0"]]
    cases += [[{"kind": "number", "unit": "MB", "sig": 2}, "12.34 MB"]]
    symbols = {"b": 2, "h": 4, "tq": 5}
    cases += [
        [{"kind": "shape", "symbols": symbols}, t] for t in ["(B, h, T_q, 7)", "torch.Size([2, 4])", "[b,H,tq]", "(5,)"]
    ]
    cases += [[{"kind": "choice"}, "  Only  the PAST "]]
    script = (
        "global.window = {}; global.document = {readyState: 'complete', querySelectorAll: () => []};\n"
        + JS.read_text()
        + "\nconst cases = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n"
        "console.log(JSON.stringify(cases.map(([r, t]) => { const n = window.selfcheck.normalise(r, t);"
        " return [n, window.selfcheck.digest('salt', n)]; })));"
    )
    done = subprocess.run([_node(), "-e", script], input=json.dumps(cases), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for (rules, typed), (js_norm, js_hash) in zip(cases, got, strict=True):
        text = typed[: -len(rules["unit"])] if rules.get("unit") else typed
        py = sc.normalise(
            rules["kind"], text, sig=rules.get("sig"), decimals=rules.get("decimals"), symbols=rules.get("symbols")
        )
        assert js_norm == py, (rules, typed)
        assert js_hash == sc.digest("salt", py)


def test_javascript_decodes_the_solution():
    html = "<p>Solution: 73921 \u00d7 2 = 147842</p>"
    encoded = sc.encode_solution("abc", html)
    script = (
        "global.window = {}; global.document = {readyState: 'complete', querySelectorAll: () => []};\n"
        "global.atob = s => Buffer.from(s, 'base64').toString('latin1');\n"
        + JS.read_text()
        + f"\nconsole.log(window.selfcheck.decodeSolution('abc', {json.dumps(encoded)}));"
    )
    done = subprocess.run([_node(), "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == html


# ---- a small book: the answers come from the glued outputs and never show in the page ----------

ANSWERS = {"count": 73921, "ratio": 0.0123456, "shape": (7, 13, 29)}
IN_CLEAR = ["73921", "73,921", "0.0123", "(7, 13, 29)", "(7,13,29)", "7, 13, 29"]

PAGE_MD = """# Tiny chapter

```{{selfcheck}} How many?
:kind: number
:answer-glue: {count}
:label: sc-count

wrong: 73920 :: Off by one.

The count is 73921, since we add one.
```

```{{selfcheck}} What ratio?
:kind: number
:sig: 3
:answer-glue: ratio
:label: sc-ratio
```

```{{selfcheck}} What shape does the output have, with $B = 7$?
:kind: shape
:symbols: B=7, T=13, d=29
:answer-glue: shape
:label: sc-shape

wrong: (B, T, T) :: That is the score matrix.

It is $(B, T, d)$, that is (7, 13, 29).
```

```{{selfcheck}} Does the mask hide the future?
:kind: choice
:answer-glue: pick

option: yes
option: no

wrong: no :: Look at the upper triangle.
```
"""


def _book(tmp_path, count_key="count"):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / '_ext')!r})\n"
        "extensions = ['myst_nb', 'selfcheck']\n"
        "nb_execution_mode = 'off'\n"
        "myst_enable_extensions = ['dollarmath', 'colon_fence']\n"
        "exclude_patterns = ['_build']\n"
    )
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_markdown_cell(PAGE_MD.format(count=count_key)))
    code = nbformat.v4.new_code_cell("glue(...)", metadata={"tags": ["remove-cell"]})
    for key, value in [*ANSWERS.items(), ("pick", "yes")]:
        prefix = "application/papermill.record/"
        code.outputs.append(
            nbformat.v4.new_output(
                "display_data",
                data={prefix + "text/plain": repr(value)},
                metadata={"scrapbook": {"name": key, "mime_prefix": prefix}},
            )
        )
    nb.cells.append(code)
    nbformat.write(nb, src / "index.ipynb")
    return src


def _sphinx(src, out, builder="html"):
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", builder, "-q", "-W", str(src), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_built_page_holds_hashes_and_no_right_answer(tmp_path):
    src = _book(tmp_path)
    done = _sphinx(src, tmp_path / "html")
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "html" / "index.html").read_text()
    boxes = re.findall(r'data-selfcheck="([^"]+)"', html)
    assert len(boxes) == 4
    datas = [json.loads(b.replace("&quot;", '"').replace("&amp;", "&")) for b in boxes]
    count = next(d for d in datas if d["id"] == "sc-count")
    assert count["right"] == sc.digest(count["salt"], "73921")
    assert sc.decode_solution(count["salt"], re.search(r'data-encoded="([^"]+)"', html).group(1)).count("73921")
    assert (tmp_path / "html" / "_static" / "selfcheck.js").is_file()
    # no right answer in clear in any page, script or the search index (the notebook's own
    # download under _sources is the notebook itself, outputs included)
    for path in (tmp_path / "html").rglob("*"):
        if path.suffix in {".html", ".js", ".json"} and "_sources" not in path.parts:
            text = path.read_text(errors="replace")
            for clear in IN_CLEAR:
                assert clear not in text, f"{clear!r} in {path.name}"


def test_a_missing_glue_key_fails_the_build(tmp_path):
    src = _book(tmp_path, count_key="no_such_key")
    done = _sphinx(src, tmp_path / "html")
    assert done.returncode != 0
    assert "no glued value 'no_such_key'" in done.stderr


# (how the page's questions are changed, words the build's error must hold besides the file's name)
BAD_LABELS = {
    "two questions with one label": (("sc-ratio", "sc-count"), ["two self-check questions", "'sc-count'"]),
    "a label with a double quote": (("sc-ratio", 'sc-"ratio'), ["label 'sc-\"ratio'", "letters, digits"]),
    "a label with a single quote": (("sc-ratio", "sc-r'atio"), ['label "sc-r\'atio"', "letters, digits"]),
    "a label with a space": (("sc-ratio", "sc ratio"), ["label 'sc ratio'"]),
}


def _relabelled(src, old, new):
    notebook = nbformat.read(src / "index.ipynb", as_version=4)
    cell = notebook.cells[0]
    assert f":label: {old}" in cell.source
    cell.source = cell.source.replace(f":label: {old}", f":label: {new}")
    nbformat.write(notebook, src / "index.ipynb")
    return notebook


@pytest.mark.parametrize("case", BAD_LABELS)
def test_a_bad_or_repeated_label_is_refused_naming_the_file(case):
    (old, new), words = BAD_LABELS[case]
    notebook = nbformat.writes(_relabelled(_book_in_memory(), old, new))
    with pytest.raises(sc.SelfCheckError) as caught:
        sc.questions_in_notebook(json.loads(notebook), "chapters/index")
    assert "chapters/index" in str(caught.value) and all(w in str(caught.value) for w in words), caught.value


def _book_in_memory():
    import tempfile

    return _book(Path(tempfile.mkdtemp()))


@pytest.mark.parametrize("case", ["two questions with one label", "a label with a double quote"])
def test_the_build_refuses_a_bad_or_repeated_label(case, tmp_path):
    (old, new), words = BAD_LABELS[case]
    src = _book(tmp_path)
    _relabelled(src, old, new)
    done = _sphinx(src, tmp_path / "html")
    assert done.returncode != 0
    assert "index.ipynb" in done.stderr and all(w in done.stderr for w in words), done.stderr[-2000:]


def test_other_builders_print_the_answer_after_the_question(tmp_path):
    src = _book(tmp_path)
    done = _sphinx(src, tmp_path / "text", builder="text")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "text" / "index.txt").read_text()
    answers = [re.sub(r"\W+", " ", a).strip() for a in re.findall(r"Answer:(.*)", text)]
    assert answers == ["73921", "0 0123", "7 13 29", "yes"]
    assert text.index("How many?") < text.index("Answer:") < text.index("The count is 73921")


def test_the_pdf_edition_prints_each_question_with_its_answer(tmp_path):
    src = _book(tmp_path)
    done = _sphinx(src, tmp_path / "latex", builder="latex")
    assert done.returncode == 0, done.stderr
    tex = next((tmp_path / "latex").glob("*.tex")).read_text()
    assert tex.count("Check yourself") == 4
    for answer in ["73921", "0.0123", "(7, 13, 29)", "yes"]:
        assert re.search(r"Answer:.{0,80}" + re.escape(answer), tex), answer
    assert tex.index("How many?") < tex.index("73921}") < tex.index("The count is 73921")


# ---- the book itself, once built (scripts/build_book.sh) ----------------------------------------

SITE = ROOT / "_build" / "html"
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_asks_three_questions_with_hinted_wrong_answers(chapter):
    questions = sc.questions_in_notebook(json.loads(chapter.read_text()), f"chapters/{chapter.stem}")
    assert len(questions) >= 3
    assert all(q["wrong"] for q in questions), [q["id"] for q in questions if not q["wrong"]]


def box_html(html: str, qid: str) -> str:
    """The HTML of the self-check box ``qid``: from its ``<div`` to the ``</div>`` that closes it
    (the divs inside it counted), and nothing of the page after it."""
    start = html.index(f'<div class="selfcheck" id="{qid}"')
    depth = 0
    for tag in re.finditer(r"<div\b|</div\s*>", html[start:]):
        depth += 1 if tag.group(0).startswith("<div") else -1
        if depth == 0:
            return html[start : start + tag.end()]
    raise AssertionError(f"{qid}: its box is never closed")


def test_the_box_is_cut_where_it_closes():
    page = (
        '<p>before 21</p><div class="selfcheck" id="sc-1" data-selfcheck="{}"><p>Q?</p>'
        '<div class="selfcheck-solution" hidden data-encoded="x"></div></div>\n<div><pre># (1, 21, V)</pre></div>'
    )
    box = box_html(page, "sc-1")
    assert box.startswith('<div class="selfcheck"') and box.endswith("</div></div>") and "21" not in box


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_built_chapter_keeps_its_answers_out_of_the_questions(chapter):
    """In the built page, no question's box (its data, its encoded solution) holds its answer in
    clear, and the hidden cells that glue the answers are not on the page."""
    page = SITE / "chapters" / f"{chapter.stem}.html"
    if not page.exists():
        if os.environ.get("REQUIRE_BUILT_BOOK"):  # .ci/run, after building the book
            pytest.fail(f"REQUIRE_BUILT_BOOK is set but {page} is not there")
        pytest.skip("the book is not built (scripts/build_book.sh)")
    html = page.read_text(encoding="utf-8")
    questions = sc.questions_in_notebook(json.loads(chapter.read_text()), f"chapters/{chapter.stem}")
    boxes = dict(re.findall(r'<div class="selfcheck" id="([^"]+)" data-selfcheck="([^"]+)"', html))
    assert sorted(boxes) == sorted(q["id"] for q in questions)
    for q in questions:
        box = box_html(html, q["id"])
        data = json.loads(boxes[q["id"]].replace("&quot;", '"').replace("&amp;", "&"))
        assert data["right"] == sc.digest(data["salt"], q["right"])
        if q["kind"] == "choice":
            continue  # the options are on the page by design; nothing says which one is right
        # the box without its hashes and its encoded solution: its question, data and hints
        visible = re.sub(r'data-encoded="[^"]*"|[0-9a-f]{64}', "", box).replace(q["id"], "")  # its label has digits
        for clear in {q["type"], q["right"]}:
            found = re.search(r"(?<![\w.])" + re.escape(clear) + r"(?![\w.])", visible)
            assert not found, f"{q['id']}: its answer {clear!r} in clear in its box"
    assert "glue(" not in html and "from myst_nb import glue" not in html
