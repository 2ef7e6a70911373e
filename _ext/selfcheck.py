"""Sphinx extension: self-check questions that give feedback on the published page, no kernel.

A chapter asks a question where a reader should stop and predict::

    ```{selfcheck} With B = 2, h = 4 and T = 5, what shape do the weights have?
    :kind: shape
    :answer-glue: q05_weights_shape
    :symbols: B=2, h=4, T=5
    :label: sc-05-1

    wrong: (B, T, T) :: That is the weight matrix of one head; each head has its own.
    wrong: glue:q05_scores_wrong :: ...

    The folded solution, in MyST markdown.
    ```

The right answer is read at build time from the notebook's own glued outputs
(``myst_nb.glue(key, value, display=False)`` in a code cell), so it cannot drift from what the
code computes; a missing key fails the build. The page stores only salted SHA-256 hashes of the
normalised right answer and of the known wrong answers (each with its hint), and the solution
encoded (so that neither the page source nor the search index shows it); ``selfcheck.js``
normalises what the reader types in the same way, hashes it and compares. Kinds:

- ``number``: exact (an integer such as a parameter count: ``4,096``, ``4096.0`` and ``4.096e3``
  are the same answer), or rounded half up to ``:sig:`` significant digits or ``:decimals:``
  decimal places (the question says how to round). ``:unit:`` is shown beside the box and may be
  typed after the number.
- ``shape``: a tuple such as ``(2, 4, 5, 5)``; spacing, brackets, a trailing comma and
  ``torch.Size`` are ignored, and the symbols of ``:symbols:`` (case, ``_`` and braces ignored,
  so ``T_q``, ``t_q`` and ``T_{q}`` are the same) stand for their sizes, so ``(B, h, T, T)``
  is also right.
- ``choice``: one of the ``option:`` lines; the glued value is the text of the right option.

Other builders (LaTeX for the PDF edition, text) print the question with its answer and the
solution right after it.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.errors import SphinxError
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

STATIC = Path(__file__).resolve().parent / "static"
KINDS = ("number", "shape", "choice")
logger = logging.getLogger(__name__)


class SelfCheckError(SphinxError, ValueError):
    """A self-check question that cannot be built (a missing glue key, a bad answer)."""

    category = "Self-check error"


# ---------------------------------------------------------------------------------------------
# Normalisation: the same rules as ``normalise`` in static/selfcheck.js
# ---------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"^([+-]?)(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?$")


def _decimal(text: str) -> Decimal:
    """Parse a number as a reader writes it: spaces, ``_``, thin spaces and thousands commas allowed."""
    s = re.sub(r"[\s_,\u2009\u202f]", "", str(text)).lower().replace("\u2212", "-")
    s = s.replace("\u00d710^", "e").replace("x10^", "e").replace("*10^", "e")
    m = _NUMBER.match(s)
    if not m or not (m.group(2) or m.group(3)):
        raise SelfCheckError(f"not a number: {text!r}")
    return Decimal(s)


def _canonical(d: Decimal) -> str:
    """One spelling per value: plain digits, no exponent, no trailing zeros, no ``-0``."""
    if d.is_zero():
        return "0"
    sign, digits, exp = d.as_tuple()
    digits = "".join(map(str, digits)).lstrip("0") or "0"
    # strip trailing zeros into the exponent
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    digits = stripped
    if exp >= 0:
        body = digits + "0" * exp
    elif -exp >= len(digits):
        body = "0." + "0" * (-exp - len(digits)) + digits
    else:
        body = digits[:exp] + "." + digits[exp:]
    return ("-" if sign else "") + body


def round_number(value, *, sig: int | None = None, decimals: int | None = None) -> str:
    """Round half up to ``sig`` significant digits or ``decimals`` places (or keep exact); canonical text."""
    d = value if isinstance(value, Decimal) else _decimal(repr(value) if isinstance(value, float) else value)
    if sig is not None and not d.is_zero():
        exponent = d.adjusted() - sig + 1
        d = d.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)
    elif decimals is not None:
        d = d.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return _canonical(d)


def _symbol(name: str) -> str:
    return re.sub(r"[_{}\s\\]", "", name).lower()


def parse_symbols(text: str | None) -> dict[str, int]:
    """``"B=2, h=4, T_q=5"`` -> ``{"b": 2, "h": 4, "tq": 5}`` (names normalised as in answers)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, size = part.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit():
            raise SelfCheckError(f"bad symbol {part!r} in :symbols: (write NAME=SIZE, e.g. T_q=5)")
        key = _symbol(name)
        if key in out:
            raise SelfCheckError(f"symbol {name.strip()!r} in :symbols: clashes with another (case and _ ignored)")
        out[key] = int(size)
    return out


def normalise_shape(text, symbols: dict[str, int] | None = None) -> str:
    """``"torch.Size([2, 4, 5,5])"``, ``"(B, h, T, T)"`` (with B=2, h=4, T=5) -> ``"(2,4,5,5)"``."""
    if isinstance(text, (tuple, list)):
        text = "(" + ",".join(str(int(n)) for n in text) + ")"
    s = str(text).strip()
    s = re.sub(r"^torch\.size", "", s, flags=re.I).strip()
    s = s.strip("()[] ")
    dims = [d.strip() for d in re.split(r"[,\u00d7]|\s+x\s+", s)]
    if dims and dims[-1] == "":
        dims = dims[:-1]
    out = []
    for d in dims:
        d = d.strip("()[] ")
        if re.fullmatch(r"\d+", d):
            out.append(str(int(d)))
        else:
            key = _symbol(d)
            out.append(str(symbols[key]) if symbols and key in symbols else key)
    return "(" + ",".join(out) + ")"


def normalise_choice(text) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().lower()


def normalise(kind: str, value, *, sig=None, decimals=None, symbols=None) -> str:
    if kind == "number":
        return round_number(value, sig=sig, decimals=decimals)
    if kind == "shape":
        return normalise_shape(value, symbols)
    if kind == "choice":
        return normalise_choice(value)
    raise SelfCheckError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")


def digest(salt: str, normalised: str) -> str:
    return hashlib.sha256(f"{salt}:{normalised}".encode()).hexdigest()


def make_salt(docname: str, qid: str) -> str:
    return hashlib.sha256(f"selfcheck:{docname}:{qid}".encode()).hexdigest()[:16]


def _keystream(salt: str, n: int) -> bytes:
    stream = bytearray()
    counter = 0
    while len(stream) < n:
        stream += hashlib.sha256(f"{salt}:{counter}".encode()).digest()
        counter += 1
    return bytes(stream[:n])


def encode_solution(salt: str, html: str) -> str:
    """XOR the solution with a SHA-256 key stream of the salt, base64: no spoiler in the page source."""
    data = html.encode()
    return base64.b64encode(bytes(a ^ b for a, b in zip(data, _keystream(salt, len(data)), strict=True))).decode()


def decode_solution(salt: str, encoded: str) -> str:
    data = base64.b64decode(encoded)
    return bytes(a ^ b for a, b in zip(data, _keystream(salt, len(data)), strict=True)).decode()


# ---------------------------------------------------------------------------------------------
# Glued values, read from the notebook's saved outputs
# ---------------------------------------------------------------------------------------------


def read_glue(notebook: dict) -> dict[str, object]:
    """Every value glued in a notebook (``myst_nb.glue``), from its ``text/plain`` representation."""
    values: dict[str, object] = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs", []):
            meta = (out.get("metadata") or {}).get("scrapbook")
            if not meta:
                continue
            prefix = meta.get("mime_prefix", "")
            plain = out.get("data", {}).get(prefix + "text/plain")
            if plain is None:
                continue
            plain = "".join(plain) if isinstance(plain, list) else plain
            try:
                values[meta["name"]] = ast.literal_eval(plain)
            except (ValueError, SyntaxError):
                values[meta["name"]] = plain
    return values


def glued(values: dict, key: str, where: str):
    if key not in values:
        known = ", ".join(sorted(values)) or "none"
        raise SelfCheckError(
            f"{where}: no glued value {key!r} in the notebook's saved outputs (glued keys: {known}); "
            "glue it in a code cell (myst_nb.glue) and re-execute the notebook"
        )
    return values[key]


# ---------------------------------------------------------------------------------------------
# Parsing the directive's body
# ---------------------------------------------------------------------------------------------

_LINE = re.compile(r"^(wrong|option)\s*:\s*(.*)$")


def split_body(lines: list[str]) -> tuple[list[tuple[str, str]], list[str], int]:
    """Leading ``wrong: ANSWER :: HINT`` and ``option: TEXT`` lines, then the solution.

    Returns the (kind, text) pairs, the solution's lines and the index where it starts.
    """
    entries, i = [], 0
    while i < len(lines):
        line = lines[i].strip()
        m = _LINE.match(line)
        if m:
            entries.append((m.group(1), m.group(2).strip()))
        elif line:
            break
        i += 1
    return entries, lines[i:], i


def build_question(spec: dict, values: dict, docname: str, qid: str) -> dict:
    """The data the page needs (hashes, hints, options) and, for other builders, the answer.

    ``spec`` holds ``kind``, ``answer_glue`` or ``answer``, ``sig``, ``decimals``, ``unit``,
    ``symbols`` (text), ``entries`` (from :func:`split_body`).
    """
    where = f"{docname}: self-check {qid!r}"
    kind = spec["kind"]
    if kind not in KINDS:
        raise SelfCheckError(f"{where}: :kind: {kind!r} is not one of {', '.join(KINDS)}")
    sig, decimals = spec.get("sig"), spec.get("decimals")
    if sig is not None and decimals is not None:
        raise SelfCheckError(f"{where}: give :sig: or :decimals:, not both")
    if kind != "number" and (sig is not None or decimals is not None or spec.get("unit")):
        raise SelfCheckError(f"{where}: :sig:, :decimals: and :unit: are for kind number")
    symbols = parse_symbols(spec.get("symbols"))
    if spec.get("answer_glue"):
        answer = glued(values, spec["answer_glue"], where)
    else:
        raise SelfCheckError(f"{where}: needs :answer-glue: KEY (the value glued by the notebook's code)")
    if kind == "number" and isinstance(answer, float) and sig is None and decimals is None:
        if not answer.is_integer():
            raise SelfCheckError(f"{where}: the answer {answer!r} is not an integer: give :sig: or :decimals:")
    if kind == "number" and (isinstance(answer, bool) or not isinstance(answer, (int, float, str))):
        raise SelfCheckError(f"{where}: glue a plain int or float for a number, got {answer!r}")

    def norm(value, what):
        try:
            return normalise(kind, value, sig=sig, decimals=decimals, symbols=symbols)
        except SelfCheckError as exc:
            raise SelfCheckError(f"{where}: {what}: {exc}") from None

    salt = make_salt(docname, qid)
    right = norm(answer, "the answer")
    options, wrong = [], []
    for entry_kind, text in spec["entries"]:
        if entry_kind == "option":
            options.append(text)
            continue
        value, sep, hint = text.partition("::")
        value, hint = value.strip(), hint.strip()
        if not sep or not value or not hint:
            raise SelfCheckError(f"{where}: write a wrong answer as 'wrong: ANSWER :: HINT', got {text!r}")
        if value.startswith("glue:"):
            value = glued(values, value[5:].strip(), where)
        n = norm(value, f"wrong answer {value!r}")
        if n == right:
            raise SelfCheckError(f"{where}: the wrong answer {value!r} is the right answer once normalised")
        wrong.append((n, hint))
    if kind == "choice":
        if len(options) < 2:
            raise SelfCheckError(f"{where}: a choice needs at least two 'option:' lines")
        if right not in {normalise_choice(o) for o in options}:
            raise SelfCheckError(f"{where}: the glued answer is none of the options")
    elif options:
        raise SelfCheckError(f"{where}: 'option:' lines are for kind choice")
    rules = {"kind": kind}
    if sig is not None:
        rules["sig"] = sig
    if decimals is not None:
        rules["decimals"] = decimals
    if symbols:
        rules["symbols"] = symbols
    if spec.get("unit"):
        rules["unit"] = spec["unit"]
    data = {
        "id": qid,
        "salt": salt,
        "rules": rules,
        "right": digest(salt, right),
        "wrong": [[digest(salt, n), hint] for n, hint in wrong],
        "options": options,
    }
    if kind == "number":
        shown = right
    elif kind == "shape":
        shown = answer if isinstance(answer, str) else normalise_shape(answer).replace(",", ", ")
    else:
        shown = next(o for o in options if normalise_choice(o) == right)
    return {"data": data, "answer_text": str(shown) + (f" {spec['unit']}" if spec.get("unit") else ""), "right": right}


# ---------------------------------------------------------------------------------------------
# Nodes and directive
# ---------------------------------------------------------------------------------------------


class selfcheck_node(nodes.General, nodes.Element):
    pass


class selfcheck_solution(nodes.General, nodes.Element):
    pass


def _nonnegative(text):
    return directives.nonnegative_int(text)


class SelfCheckDirective(SphinxDirective):
    required_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = {
        "kind": lambda t: directives.choice(t, KINDS),
        "answer-glue": directives.unchanged_required,
        "sig": directives.positive_int,
        "decimals": _nonnegative,
        "unit": directives.unchanged,
        "symbols": directives.unchanged,
        "label": directives.unchanged_required,
    }

    def run(self):
        env = self.env
        docname = env.docname
        counter = env.temp_data.setdefault("selfcheck_counter", {})
        counter[docname] = counter.get(docname, 0) + 1
        qid = self.options.get("label") or f"sc-{re.sub(r'[^a-z0-9]+', '-', docname.lower())}-{counter[docname]}"
        entries, solution_lines, start = split_body(list(self.content))
        spec = {
            "kind": self.options.get("kind", "number"),
            "answer_glue": self.options.get("answer-glue"),
            "sig": self.options.get("sig"),
            "decimals": self.options.get("decimals"),
            "unit": self.options.get("unit"),
            "symbols": self.options.get("symbols"),
            "entries": entries,
        }
        # a missing or bad answer raises SelfCheckError, which stops the build with its message
        built = build_question(spec, _glue_values(env, docname), docname, qid)
        node = selfcheck_node()
        node["ids"].append(qid)
        node["data"] = built["data"]
        node["answer_text"] = built["answer_text"]
        node["docname"] = docname
        question = nodes.paragraph()
        question["classes"].append("selfcheck-question")
        inline, messages = self.state.inline_text(self.arguments[0], self.lineno)
        question += inline
        node += question
        node += messages
        if any(line.strip() for line in solution_lines):
            solution = selfcheck_solution()
            self.state.nested_parse(self.content[start:], self.content_offset + start, solution)
            node += solution
        self.set_source_info(node)
        return [node]


def _glue_values(env, docname):
    cache = env.temp_data.setdefault("selfcheck_glue", {})
    if docname not in cache:
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb":
            cache[docname] = {}
        else:
            cache[docname] = read_glue(json.loads(path.read_text(encoding="utf-8")))
    return cache[docname]


# ---------------------------------------------------------------------------------------------
# HTML: hashes and the encoded solution; the reader's side is static/selfcheck.js
# ---------------------------------------------------------------------------------------------


def visit_html(self, node):
    self.body.append(
        f'<div class="selfcheck" id="{node["ids"][0]}" data-selfcheck="{self.attval(json.dumps(node["data"]))}">'
        '<p class="selfcheck-title">Check yourself</p>'
    )


def depart_html(self, node):
    self.body.append("</div>\n")


def _encode_solutions(app, doctree, docname):
    """In HTML, render each solution now and keep it only encoded, in an attribute: neither the
    page's text nor the search index holds it."""
    if app.builder.format != "html":
        return
    for node in list(doctree.findall(selfcheck_solution)):
        box = nodes.container()
        box += [child.deepcopy() for child in node.children]
        html = app.builder.render_partial(box)["fragment"]
        salt = node.parent["data"]["salt"]
        encoded = encode_solution(salt, html)
        node.replace_self(
            nodes.raw("", f'<div class="selfcheck-solution" hidden data-encoded="{encoded}"></div>', format="html")
        )


def _skip(self, node):
    raise nodes.SkipNode


def _replace_for_other_builders(app, doctree, docname):
    """Outside HTML, print the question, its answer and its solution in clear."""
    if app.builder.format == "html":
        return
    for node in list(doctree.findall(selfcheck_node)):
        box = nodes.admonition()
        box["classes"].append("selfcheck")
        box += nodes.title(text="Check yourself")
        body = nodes.container()
        answer = nodes.paragraph()
        answer += nodes.strong(text="Answer:")
        answer += nodes.Text(" ")
        answer += nodes.literal(text=node["answer_text"])
        solutions = [c for c in node.children if isinstance(c, selfcheck_solution)]
        body += [c for c in node.children if not isinstance(c, selfcheck_solution)]
        body += answer
        for solution in solutions:
            body += solution.children
        box += body
        node.replace_self(box)


def _add_static(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def _drop_glue_cache(app, env, docnames):
    env.temp_data.pop("selfcheck_glue", None)


def setup(app):
    app.connect("config-inited", _add_static)
    app.connect("env-before-read-docs", _drop_glue_cache)
    app.connect("doctree-resolved", _replace_for_other_builders)
    app.connect("doctree-resolved", _encode_solutions)
    app.add_css_file("selfcheck.css")
    app.add_js_file("selfcheck.js", loading_method="defer")
    app.add_node(
        selfcheck_node,
        html=(visit_html, depart_html),
        latex=(_skip, None),
        text=(_skip, None),
        man=(_skip, None),
        texinfo=(_skip, None),
    )
    app.add_node(
        selfcheck_solution,
        html=(_skip, None),
        latex=(_skip, None),
        text=(_skip, None),
        man=(_skip, None),
        texinfo=(_skip, None),
    )
    app.add_directive("selfcheck", SelfCheckDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ---------------------------------------------------------------------------------------------
# Reading the questions of a notebook without Sphinx (for the tests)
# ---------------------------------------------------------------------------------------------

_BLOCK = re.compile(r"^(`{3,}|:{3,})\{selfcheck\}[ \t]*([^\n]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
_OPTION = re.compile(r"^:([\w-]+):[ \t]*(.*)$")


def questions_in_notebook(notebook: dict, docname: str) -> list[dict]:
    """Every self-check question of a notebook, with its answer as a reader would type it."""
    values = read_glue(notebook)
    found = []
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for m in _BLOCK.finditer(source):
            lines = m.group(3).split("\n")
            options = {}
            while lines and _OPTION.match(lines[0]):
                key, value = _OPTION.match(lines[0]).groups()
                options[key] = value.strip()
                lines = lines[1:]
            entries, _, _ = split_body(lines)
            spec = {
                "kind": options.get("kind", "number"),
                "answer_glue": options.get("answer-glue"),
                "sig": int(options["sig"]) if "sig" in options else None,
                "decimals": int(options["decimals"]) if "decimals" in options else None,
                "unit": options.get("unit"),
                "symbols": options.get("symbols"),
                "entries": entries,
            }
            qid = options.get("label") or f"sc-{re.sub(r'[^a-z0-9]+', '-', docname.lower())}-{len(found) + 1}"
            built = build_question(spec, values, docname, qid)
            wrong = []
            for kind, text in entries:
                if kind == "wrong":
                    value, _, hint = text.partition("::")
                    value = value.strip()
                    if value.startswith("glue:"):
                        value = str(values[value[5:].strip()])
                    wrong.append((value, hint.strip()))
            found.append(
                {
                    "id": qid,
                    "kind": spec["kind"],
                    "question": m.group(2).strip(),
                    "type": built["answer_text"],
                    "right": built["right"],
                    "wrong": wrong,
                    "options": built["data"]["options"],
                }
            )
    return found
