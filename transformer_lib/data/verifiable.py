"""A task whose answers a program checks (chapter "Preferences and rewards"): chapter
"Fine-tuning"'s dates, written in a human format, to be rewritten in ISO form ``yyyy-mm-dd``.

A reward is a function ``reward(answer, target) -> float`` in ``[0, 1]`` (:data:`REWARDS`):

- ``"exact"`` (:func:`exact_reward`): 1 when the answer is the target date, else 0: the verifier.
- ``"chars"`` (:func:`char_reward`): the share of the target's characters the answer has in place,
  partial credit that is never 1 for a wrong date.
- ``"format"`` (:func:`format_reward`): 1 for any real date written ``yyyy-mm-dd``, right or wrong:
  a verifier that checks the form only, the one a model learns to fool.
- ``"steps"`` (:func:`step_reward`): for answers with a scratchpad (:func:`scratchpad_response`),
  the share of its checkable steps that are right, the final date counted as one more step.

Preference pairs come from the verifier too (:func:`preference_triples`): the right date against a
plausible wrong one, the same date with one field moved (:func:`wrong_date`). The ``dpo`` command
reads them from JSON Lines, one ``{"prompt": ..., "chosen": ..., "rejected": ...}`` a line
(:func:`write_preferences`, :func:`read_preferences`).
"""

from __future__ import annotations

import calendar
import datetime
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._checks import check_int
from .instructions import END_TOKEN, _pair_problem, date_pairs
from .tasks import _MONTHS, DATE_FORMATS, date_field_spans

__all__ = [
    "REWARDS",
    "char_reward",
    "check_scratchpad",
    "exact_reward",
    "format_reward",
    "preference_triples",
    "read_preferences",
    "scratchpad_pairs",
    "scratchpad_response",
    "step_reward",
    "write_preferences",
    "wrong_date",
]

_ISO = re.compile(r"\d{4}-\d{2}-\d{2}")


def _date(text: str) -> datetime.date | None:
    """``text`` as a date when it is exactly one written ``yyyy-mm-dd`` that exists, else None."""
    if not _ISO.fullmatch(text):
        return None
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:  # 2003-02-30
        return None


def _final(answer: str) -> str:
    """The date an answer ends with: after the scratchpad's last ``" = "``, or the whole answer."""
    return answer.rpartition(" = ")[2].strip()


def exact_reward(answer: str, target: str) -> float:
    """1.0 when ``answer`` (its final date, after a scratchpad) is ``target``, else 0.0 (chapter "Preferences and
    rewards")."""
    return float(_final(answer) == target)


def char_reward(answer: str, target: str) -> float:
    """The share of ``target``'s characters that ``answer`` has at the same place (chapter "Preferences and rewards"):
    partial credit, 1.0 only for the right date."""
    answer = _final(answer)
    if not target:
        raise ValueError("char_reward needs a target date, got an empty one")
    return sum(a == b for a, b in zip(answer, target, strict=False)) / max(len(target), len(answer))


def format_reward(answer: str, target: str) -> float:
    """1.0 for any real date written ``yyyy-mm-dd``, whatever ``target`` is (chapter "Preferences and rewards"): a
    verifier that checks the form and not the content."""
    return float(_date(_final(answer)) is not None)


# A scratchpad ------------------------------------------------------------------------------------


def scratchpad_response(date: datetime.date, fmt: str) -> str:
    """The answer with its steps written out (chapter "Preferences and rewards"), each one a program can check: the
    year, the month as a number (with its name where the format writes one), the day, then the date::

        "the 17th of april, 2003"
        -> "year 2003, month april = 04, day 17 = 2003-04-17"
    """
    text, spans = date_field_spans(date, fmt)
    month = text[spans["month"].start : spans["month"].stop]
    month_step = f"{month} = {date.month:02d}" if month.isalpha() else f"{date.month:02d}"
    return f"year {date.year}, month {month_step}, day {date.day} = {date.isoformat()}"


def scratchpad_pairs(n: int, seed: int = 0, formats: Sequence[str] = DATE_FORMATS) -> list[tuple[str, str]]:
    """:func:`~transformer_lib.data.date_pairs`' prompts with :func:`scratchpad_response` answers (chapter "Preferences
    and rewards")."""
    out = []
    for prompt, iso in date_pairs(n, seed, formats):
        date = datetime.date.fromisoformat(iso)
        fmt = next(f for f in formats if date_field_spans(date, f)[0] == prompt)
        out.append((prompt, scratchpad_response(date, fmt)))
    return out


_STEPS = re.compile(r"year (\d+), month (?:([a-z]+) = )?(\d+), day (\d+) = (.*)")


def check_scratchpad(answer: str, target: str) -> dict[str, bool]:
    """Each step of a scratchpad answer checked against the ``target`` date (chapter "Preferences and rewards"):
    ``year``, ``month`` (the number, and the name's number where a name is written), ``day`` and ``date``
    (the final answer); every step False when the answer does not follow the layout."""
    date, m = datetime.date.fromisoformat(target), _STEPS.fullmatch(answer.strip())
    if m is None:
        return dict.fromkeys(("year", "month", "day", "date"), False)
    year, name, month, day, final = m.groups()
    name_ok = name is None or (
        name[:3] in [x[:3] for x in _MONTHS] and [x[:3] for x in _MONTHS].index(name[:3]) + 1 == date.month
    )
    return {
        "year": year == str(date.year),
        "month": name_ok and month == f"{date.month:02d}",
        "day": day == str(date.day),
        "date": final.strip() == target,
    }


def step_reward(answer: str, target: str) -> float:
    """The share of a scratchpad answer's steps that are right (:func:`check_scratchpad`; chapter "Preferences and
    rewards")."""
    checks = check_scratchpad(answer, target)
    return sum(checks.values()) / len(checks)


#: The rewards by name, each ``reward(answer, target) -> float`` in ``[0, 1]`` (chapter "Preferences and rewards").
REWARDS = {"exact": exact_reward, "chars": char_reward, "format": format_reward, "steps": step_reward}


# Preference pairs --------------------------------------------------------------------------------


def wrong_date(target: str, rng: np.random.Generator) -> str:
    """A plausible wrong answer to ``target`` (chapter "Preferences and rewards"): the same date with one field moved,
    the day by 1 to 3, the month by 1 or the year by 1 to 10 (a day that the new month lacks is moved
    to the month's last), drawn with ``rng``; never the target itself. A target that is not a real
    date written ``yyyy-mm-dd`` (``2003-02-30``) raises a ``ValueError`` naming it."""
    date = _date(target) if isinstance(target, str) else None
    if date is None:
        raise ValueError(f"wrong_date needs a real date written yyyy-mm-dd, got {target!r}")
    field, step = int(rng.integers(3)), int(rng.choice([-1, 1]))
    if field == 0:
        out = date + datetime.timedelta(days=step * int(rng.integers(1, 4)))
    else:
        year = date.year + (step * int(rng.integers(1, 11)) if field == 2 else 0)
        month = (date.month - 1 + step) % 12 + 1 if field == 1 else date.month
        out = datetime.date(year, month, min(date.day, calendar.monthrange(year, month)[1]))
    return out.isoformat() if out != date else (date + datetime.timedelta(days=1)).isoformat()


def preference_triples(pairs: Sequence[tuple[str, str]], seed: int = 0) -> list[tuple[str, str, str]]:
    """``(prompt, chosen, rejected)`` for each ``(prompt, target)`` of ``pairs`` (chapter "Preferences and rewards"):
    the verifier's right answer against :func:`wrong_date`, drawn with ``seed``."""
    check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    return [(prompt, target, wrong_date(target, rng)) for prompt, target in pairs]


_KEYS = ("prompt", "chosen", "rejected")


def _triple_problem(item) -> str | None:
    if not isinstance(item, (dict, tuple, list)) or isinstance(item, dict) and set(item) != set(_KEYS):
        return f"needs exactly the keys {', '.join(map(repr, _KEYS))}"
    values = [item[k] for k in _KEYS] if isinstance(item, dict) else list(item)
    if len(values) != 3 or not all(isinstance(v, str) and v for v in values):
        return f"needs three non-empty strings under {', '.join(map(repr, _KEYS))}"
    if values[1] == values[2]:
        return "holds the same answer as chosen and as rejected"
    for answer in values[1:]:  # each answer after its prompt, as the model reads it
        if problem := _pair_problem((values[0], answer), (END_TOKEN,)):
            return "the pair " + problem[1].replace("a response", "an answer").replace("response", "answer")
    return None


def write_preferences(triples: Sequence, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``(prompt, chosen, rejected)`` triples to ``path`` as JSON Lines, the ``dpo`` command's
    input (chapter "Preferences and rewards"), atomically; an existing file that holds anything else is kept unless
    ``force``. A triple that is not three non-empty, different answers is refused by its index."""
    from ..utils import atomic_write

    path = Path(path)
    if isinstance(triples, (str, bytes, dict)):
        raise TypeError(f"triples must be a list of (prompt, chosen, rejected), got a {type(triples).__name__}")
    triples = list(triples)
    for i, t in enumerate(triples):
        if problem := _triple_problem(t):
            raise ValueError(f"triples[{i}] {problem}: {str(t)[:80]}")
    lines = "".join(json.dumps(dict(zip(_KEYS, t, strict=True)), ensure_ascii=False) + "\n" for t in triples)
    if path.exists() and not force and (not path.is_file() or path.read_text(encoding="utf-8") != lines):
        raise FileExistsError(f"{path} exists and holds something else: choose another path, or force=True")
    return atomic_write(path, lambda tmp: Path(tmp).write_text(lines, encoding="utf-8"))


def read_preferences(path: str | os.PathLike) -> list[tuple[str, str, str]]:
    """The ``(prompt, chosen, rejected)`` triples of a JSON Lines file, one object with those keys a
    line (chapter "Preferences and rewards"); a line that is not UTF-8, not JSON, not such an object, or whose text
    cannot be encoded (a lone surrogate, the end token's spelling) is refused by its number, and so is a file of
    fewer than two triples."""
    rows = []
    for n, raw in enumerate(Path(path).read_bytes().removeprefix(b"\xef\xbb\xbf").splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}, line {n}: not UTF-8 text (byte {raw[e.start]:#04x} at {e.start})") from None
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(
                f"{path}, line {n}: needs an object with the keys {', '.join(map(repr, _KEYS))}, "
                f"got a JSON {type(item).__name__}"
            )
        if problem := _triple_problem(item):
            raise ValueError(f"{path}, line {n}: {problem}")
        rows.append(tuple(item[k] for k in _KEYS))
    if len(rows) < 2:
        raise ValueError(f"{path} holds {len(rows)} preference pair(s): give at least 2 (one validates)")
    return rows
