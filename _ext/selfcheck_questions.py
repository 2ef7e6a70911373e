"""Self-check questions (:mod:`selfcheck`): the glued answers read from a notebook's saved
outputs, the directive's body (wrong answers with hints, options, the solution), the data a
question's box holds, its label, and every question of a notebook read without Sphinx (for the
tests).
"""

from __future__ import annotations

import ast
import re

from selfcheck_answers import (
    KINDS,
    SelfCheckError,
    digest,
    make_salt,
    normalise,
    normalise_choice,
    normalise_shape,
    parse_symbols,
)

# A label is an HTML id, a key of the reader's saved progress and a radio group's name.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_label(label: str, seen: set[str], where: str) -> None:
    """Refuse a label that is not letters, digits, ``-``, ``_`` and ``.`` (a quote would end the
    page's attribute), or one that another question of the same page already has (the two would
    share one saved answer and one radio group); ``where`` names the file. Adds it to ``seen``."""
    if not _LABEL.fullmatch(label):
        raise SelfCheckError(
            f"{where}: self-check label {label!r} may hold only letters, digits, '-', '_' and '.' (like sc-05-1)"
        )
    if label in seen:
        raise SelfCheckError(f"{where}: two self-check questions have the label {label!r}; give each its own")
    seen.add(label)


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
# Reading the questions of a notebook without Sphinx (for the tests)
# ---------------------------------------------------------------------------------------------

_BLOCK = re.compile(r"^(`{3,}|:{3,})\{selfcheck\}[ \t]*([^\n]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
_OPTION = re.compile(r"^:([\w-]+):[ \t]*(.*)$")


def questions_in_notebook(notebook: dict, docname: str) -> list[dict]:
    """Every self-check question of a notebook, with its answer as a reader would type it."""
    values = read_glue(notebook)
    found, seen = [], set()
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
            check_label(qid, seen, docname)
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
