"""Name chapters by their names, not their numbers, in the given files.

The library, its tests and its scripts once named a chapter by its place in the book: "chapter 14",
"chapters 2-3", ``transformer_lib.experiments.ch14``, ``recorded("ch14")``. A chapter inserted
before it changed all of them. This script rewrites such references, mechanically, to the names
that do not move (see ``transformer_lib/chapters.py``):

- prose: "chapter 14" becomes 'chapter "Today's block"' (the chapter's title), "chapters 2 and 3"
  'chapters "Queries, keys and values" and "Why divide by sqrt(d_k)"', and "chapters 8-10"
  'chapters "Encoder-decoder and cross-attention" to "Generation"';
- a possessive of one word: "chapter 13's split:" becomes 'the split of chapter "Tokens":';
- an exercise: "Chapter 4, exercise 4.2" becomes 'Chapter "Masking", exercise 2', and "exercise 4.2"
  elsewhere 'exercise 2 of chapter "Masking"' (the book numbers it when it is built);
- a module: ``experiments.ch14`` and ``exercises.ch04`` become ``experiments.todays_block`` and
  ``exercises.masking``, also as a file (``experiments/ch14.py``), a relative import
  (``from .ch09 import``) or a test module (``test_exercises_ch04``); a module imported by its
  old name (``from transformer_lib.experiments import ch14``) is imported, and used, by its slug,
  unless the file already has a name like it;
- a record or experiment named in a string, ``"ch14"`` or ``'ch14'``, becomes ``"todays_block"``,
  and so does the name after ``python -m transformer_lib.experiments``.

A data folder keeps its old name (``data/ch14``, ``"data" / "ch14"``): the files under
``transformer_lib/data`` are stored there, and ``transformer_lib.chapters.data_folder`` finds them.

The numbers are read as the book numbered its chapters when the text was written, 1 to 21, which
this script keeps (``NUMBERED``). Usage::

    python scripts/name_chapters.py FILE ...          # rewrite the files in place
    python scripts/name_chapters.py --check FILE ...  # list what would change, exit 1 if anything

A Python file that would no longer parse is left as it was and reported. Text that documents the
old names on purpose (``transformer_lib/chapters.py``, the aliases' docstrings, this script) is
not for it. The result is meant to be read afterwards: a sentence such as "chapter 14's block"
becomes 'chapter "Today's block"'s block', which is correct and may deserve a better turn of
phrase by hand.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _chapters_module():
    """``transformer_lib/chapters.py`` alone, without importing the library (and PyTorch)."""
    spec = importlib.util.spec_from_file_location("_chapters", ROOT / "transformer_lib" / "chapters.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a NamedTuple's class looks its module up while it is made
    spec.loader.exec_module(module)
    return module


_CHAPTERS = _chapters_module()
CHAPTERS, OLD_NAMES = _CHAPTERS.CHAPTERS, _CHAPTERS.OLD_NAMES

#: the book's numbering when the text being rewritten was written: chapter 1 to 21
NUMBERED: dict[int, str] = {
    **{int(old[2:]): slug for old, slug in OLD_NAMES.items()},
    20: "experts",
    21: "longer_than_trained",
}
TITLES = {c.slug: c.title for c in CHAPTERS}
#: the project's line length (pyproject.toml, ruff)
LINE_WIDTH = 120

_NUMBER = r"\d{1,2}(?![\d_]|\.\d)"  # 14, not 04_masking nor 4.2
_LIST = rf"{_NUMBER}(?:\s*(?:,|and|,\s*and|-|–|to)\s*{_NUMBER})*"
_PROSE = re.compile(rf"\b([Cc]hapters(?=\s+{_NUMBER}\s*(?:,|and|-|–|to)\s*\d)|[Cc]hapters?)(\s+)({_LIST})('s)?")
# 'chapter "Tokens"'s split:' reads better as 'the split of chapter "Tokens":' (one word or ``code``)
_POSSESSIVE = re.compile(r'\b([Cc])hapter ((\\?)"[^"\\]+\3")\'s (``[^`]+``|[A-Za-z][\w-]*)(?=[.,:;)]| \()')
# a title said twice once the number is gone: 'chapter "Masking" ("Masking")', 'chapter "Masking", "Masking"'
_TWICE = re.compile(r'(\b[Cc]hapter (\\?)"([^"\\]+)\2")(?: \(\2"\3\2"\)|, \2"\3\2")')
_NAMED_EXERCISE = re.compile(r'(\b[Cc]hapter (\\?)"[^"\\]+\2", [Ee]xercise )(\d{1,2})\.(\d{1,2})\b')
_EXERCISE = re.compile(r"\b([Ee]xercise )(\d{1,2})\.(\d{1,2})\b(?!\.\d)")
_OLD = "|".join(sorted(OLD_NAMES, reverse=True))
_MODULE = re.compile(rf"\b(experiments|exercises)([./])({_OLD})(?![0-9])")
_RELATIVE = re.compile(rf"(from \.)({_OLD})(?=[_a-z0-9]*\s+import)")
_TEST_MODULE = re.compile(rf"\b(test_exercises_|test_experiments_)({_OLD})\b")
_QUOTED = re.compile(rf"(?<!/ )(?<!data/)([\"'])({_OLD})\1")
_COMMAND = re.compile(rf"(transformer_lib\.experiments\s+)({_OLD})\b")


def title(number: int, quote: str = "") -> str:
    """The quoted title of the chapter that was number ``number``, written to sit inside a Python
    string delimited by ``quote`` (``'``, ``"``, or nothing outside a one-line string)."""
    if number not in NUMBERED:
        raise KeyError(number)
    name = TITLES[NUMBERED[number]]
    if quote == '"':
        return f'\\"{name}\\"'
    if quote == "'":
        return '"' + name.replace("'", "\\'") + '"'
    return f'"{name}"'


def _prose(match: re.Match, quote: str = "") -> str:
    word, space, numbers, possessive = match.group(1), match.group(2), match.group(3), match.group(4) or ""
    if not word.endswith("s"):  # one chapter: "chapter 16, 2 seeds" names chapter 16 alone
        numbers = re.match(r"\d+", numbers)[0]
        rest = match.group(3)[len(numbers) :] + possessive
        if rest:
            return _prose(re.match(_PROSE, f"{word}{space}{numbers}"), quote) + rest
    parts = re.split(r"(\s*(?:,\s*and|,|and|-|–|to)\s*)", numbers)
    if len(parts) == 3 and parts[1].strip() in ("-", "–") and int(parts[2]) == int(parts[0]) + 1:
        parts[1] = " and "  # chapters 2-3: chapters "..." and "..."
    out = []
    try:
        for part in parts:
            if re.fullmatch(r"\d+", part):
                out.append(title(int(part), quote))
            elif part.strip() in ("-", "–", "to"):
                out.append(" to ")
            else:
                out.append(part)
    except KeyError:
        return match.group(0)
    return f"{word}{space}{''.join(out)}{possessive}"


def convert(text: str, quote: str = "") -> str:
    """``text`` with its chapters named by name (see the module's docstring). ``quote`` is the
    delimiter of the one-line Python string that ``text`` is the inside of, if it is one."""
    text = _PROSE.sub(lambda m: _prose(m, quote), text)
    text = _TWICE.sub(r"\1", text)
    text = _POSSESSIVE.sub(
        lambda m: f"{'T' if m[1] == 'C' else 't'}he {m[4]} of {m[1]}hapter {m[2]}".replace(
            f"of {m[1]}hapter", "of chapter"
        ),
        text,
    )
    text = _NAMED_EXERCISE.sub(lambda m: f"{m[1]}{m[4]}", text)
    text = _EXERCISE.sub(lambda m: f"{m[1]}{m[3]} of chapter {title(int(m[2]), quote)}", text)
    text = _MODULE.sub(lambda m: f"{m[1]}{m[2]}{OLD_NAMES[m[3]]}", text)
    text = _RELATIVE.sub(lambda m: f"{m[1]}{OLD_NAMES[m[2]]}", text)
    text = _TEST_MODULE.sub(lambda m: f"{m[1]}{OLD_NAMES[m[2]]}", text)
    text = _QUOTED.sub(lambda m: f"{m[1]}{OLD_NAMES[m[2]]}{m[1]}", text)
    text = _COMMAND.sub(lambda m: f"{m[1]}{OLD_NAMES[m[2]]}", text)
    return text


def _string_quote(token: str) -> str:
    """The delimiter of a one-line string token (``'`` or ``"``), or "" for a triple-quoted one."""
    body = token.lstrip("rRbBuUfF")
    return "" if body[:3] in ('"""', "'''") else body[0]


def convert_python(text: str, width: int = LINE_WIDTH) -> str:
    """``text``, a Python module, with its chapters named by name: in its strings and comments
    (each written so that it still parses) and in its imports; a docstring's or comment's line that
    grows past ``width`` is broken in two at a space."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    renamed = _imported_old_names(text)
    edits = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME and tok.string in renamed:
            start = offsets[tok.start[0] - 1] + tok.start[1]
            edits.append((start, start + len(tok.string), renamed[tok.string]))
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            before = tok.line[: tok.start[1]] if tok.start[0] == tok.end[0] else ""
            if _QUOTED.fullmatch(tok.string) and re.search(r"/\s*$", before):
                continue  # a data folder in a path, "data" / "ch14": it keeps its name
            quote = _string_quote(tok.string) if tok.type == tokenize.STRING else ""
            new = convert(tok.string, quote)
            if tok.type == tokenize.STRING and tok.string[:2].lower() in ("f'", 'f"', "rf", "fr"):
                for old, slug in renamed.items():  # a module used inside an f-string's braces
                    new = re.sub(rf"(?<=[{{\s(]){old}(?=\.)", slug, new)
            if new != tok.string:
                start = offsets[tok.start[0] - 1] + tok.start[1]
                edits.append((start, start + len(tok.string), new))
    for start, end, new in reversed(edits):
        text = text[:start] + new + text[end:]
    text = _RELATIVE.sub(lambda m: f"{m[1]}{OLD_NAMES[m[2]]}", text)
    text = _MODULE.sub(lambda m: f"{m[1]}{m[2]}{OLD_NAMES[m[3]]}", text)
    if not edits:
        return text
    return _wrap(text, width, {line for line in lines if len(line.rstrip("\n")) > width})


def _imported_old_names(text: str) -> dict[str, str]:
    """The modules that ``text`` imports by an old name, ``from transformer_lib.experiments import
    ch14`` (or ``from . import ch14`` inside the package), each with its slug, which replaces it
    everywhere in the code: unless the file already uses that name for something else."""
    tree = ast.parse(text)
    packages = {"transformer_lib.experiments", "transformer_lib.exercises"}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module in packages or (node.level == 1 and not node.module)):
            for alias in node.names:
                old, _, rest = alias.name.partition("_")
                if alias.asname is None and old in OLD_NAMES:
                    found[alias.name] = OLD_NAMES[old] + (f"_{rest}" if rest else "")
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
    used |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    used |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
    return {old: new for old, new in found.items() if new not in used}


def _wrap(text: str, width: int, keep: frozenset[str] | set[str] = frozenset()) -> str:
    """Break each line of a docstring or a comment that is longer than ``width`` at its last space
    that fits. The rest joins the next line where that one continues the same paragraph (so the
    paragraph is filled again), else it goes on a new line at the same indentation. A line of
    ``keep`` (one that was already too long before) is left as it is."""
    for _ in range(1000):
        lines = text.splitlines(keepends=True)
        spans = {}  # line number -> (the first column that may break, the continuation's prefix, token)
        for number, tok in enumerate(tokenize.generate_tokens(io.StringIO(text).readline)):
            if tok.type == tokenize.COMMENT and re.match(r"#\s*(fmt|noqa|type|pragma)\b", tok.string):
                continue  # a directive, which must stay on its line
            if tok.type == tokenize.COMMENT:
                indent = lines[tok.start[0] - 1][: tok.start[1]]
                prefix = indent if indent.strip() == "" else " " * tok.start[1]
                spans[tok.start[0]] = (tok.start[1] + 2, prefix + "# ", ("comment", tok.start[1]))
            elif tok.type == tokenize.STRING and _string_quote(tok.string) == "":
                for row in range(tok.start[0], tok.end[0] + 1):
                    first = tok.start[1] + 3 if row == tok.start[0] else 0
                    spans[row] = (first, " " * tok.start[1], ("string", number))
        for row, (first, prefix, owner) in sorted(spans.items()):
            line = lines[row - 1].rstrip("\n")
            if len(line) <= width or lines[row - 1] in keep:
                continue
            cut = line.rfind(" ", first, width + 1)
            if cut <= len(prefix) or not line[:cut].strip():
                continue
            rest = line[cut + 1 :].lstrip()
            following = lines[row].rstrip("\n") if row < len(lines) else ""
            if _continues(line, following, prefix, owner, spans.get(row + 1)):
                lines[row - 1] = line[:cut].rstrip() + "\n"
                lines[row] = prefix + rest + " " + following[len(prefix) :] + "\n"
            else:
                lines[row - 1] = line[:cut].rstrip() + "\n" + prefix + rest + "\n"
            text = "".join(lines)
            break
        else:
            return text
    return text


def _continues(line: str, following: str, prefix: str, owner: tuple, next_span) -> bool:
    """Does ``following`` carry on the paragraph of ``line``, within the same docstring or block
    of comments: the same indentation, prose (not a list item, a code line or the docstring's
    end), and ``line`` not the start of a code block?"""
    if next_span is None or next_span[2][0] != owner[0] or next_span[1] != prefix:
        return False
    if owner[0] == "string" and next_span[2] != owner:
        return False
    body = following[len(prefix) :]
    if not following.startswith(prefix) or not body.strip() or body[0] == " ":
        return False
    if line.rstrip().endswith("::") or re.match(r'(?:[-*]|>>>|\.\.|"""|\d+\.)(?:\s|$)', body):
        return False
    return not body.startswith(('"""', ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file would change")
    args = parser.parse_args(argv)
    changed, broken = [], []
    for path in args.files:
        old = path.read_text(encoding="utf-8")
        new = convert_python(old) if path.suffix == ".py" else convert(old)
        if new == old:
            continue
        if path.suffix == ".py":
            try:
                ast.parse(new)
            except SyntaxError as e:
                broken.append(f"{path}: {e}")
                continue
        changed.append(str(path))
        if not args.check:
            path.write_text(new, encoding="utf-8")
    for name in changed:
        print(("would change " if args.check else "changed ") + name)
    for line in broken:
        print(f"left as it was (the result would not parse): {line}", file=sys.stderr)
    return 1 if (args.check and changed) or broken else 0


if __name__ == "__main__":
    sys.exit(main())
