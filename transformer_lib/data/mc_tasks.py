"""Multiple-choice tasks from the shipped text (chapter "Measuring a model"), and the files
that let ``lm-eval`` score the very same items.

Both tasks read the held-out part of Tiny Shakespeare (by default its last 10 %, which the
training command keeps for validation, so a model pretrained on the rest never saw it):

- :func:`speaker_choice_task`: after one speech, who speaks the next line? Each choice is a
  speaker's name followed by the line, so the choices differ only in the name.
- :func:`cloze_task`: a line with its last word missing, the word and three others of the text
  as choices, of other lengths: the task on which summed and normalised scores part ways.

:func:`write_lm_eval_task` writes the items as JSON Lines with a task file in ``lm-eval``'s YAML,
which ``lm_eval --tasks NAME --include_path FOLDER`` runs offline.
"""

from __future__ import annotations

import json
import numbers
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._checks import check_int
from .speeches import split_speeches

__all__ = ["MCItem", "cloze_task", "held_out_text", "speaker_choice_task", "write_lm_eval_task"]

_WORD = re.compile(r"^(.*\S)\s+([A-Za-z]+)[.,;:!?]*$")


@dataclass(frozen=True)
class MCItem:
    """A multiple-choice item (chapter "Measuring a model"): a ``context``, its ``choices`` (continuations, each
    scored after ``delimiter``) and the index of the right one, ``answer``."""

    context: str
    choices: tuple[str, ...]
    answer: int

    def __post_init__(self):
        """The context is text, at least two distinct choices, the answer one of them."""
        if not isinstance(self.context, str) or not self.context.strip():
            raise ValueError(f"context must be non-empty text, got {self.context!r}")
        if isinstance(self.choices, (str, bytes)):  # tuple("yes") would be three choices, y, e and s
            raise ValueError(f"choices must be a list of strings, got one string {self.choices!r}")
        choices = tuple(self.choices)
        if len(choices) < 2 or len(set(choices)) != len(choices) or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"choices must be at least 2 distinct non-empty strings, got {choices!r}")
        object.__setattr__(self, "choices", choices)
        whole = isinstance(self.answer, numbers.Integral) and not isinstance(self.answer, bool)
        if not (whole and 0 <= self.answer < len(choices)):
            raise ValueError(f"answer must index the {len(choices)} choices, got {self.answer!r}")
        object.__setattr__(self, "answer", int(self.answer))  # a NumPy integer, as a Python one


#: where the held-out part of the shipped Tiny Shakespeare starts, as a fraction of its characters
#: (chapter "Measuring a model"): after the training split of every shipped model trained on it. Chapter "Fine-tuning"'s
# BPE model
#: kept the last 10 % of its *tokens*, which start at 90.3 % of the characters, so the last 10 % of the
#: characters would hold 3,425 characters it trained on; tests/test_held_out_text.py checks the gap.
HELD_OUT_START = 0.91


def held_out_text(text: str, start_fraction: float = HELD_OUT_START) -> str:
    """The part of ``text`` from ``start_fraction`` of its characters on, from the start of a line
    (chapter "Measuring a model"); by default the part of the shipped text no shipped model trained on."""
    if not 0.0 <= start_fraction < 1.0:
        raise ValueError(f"start_fraction must be in [0, 1), got {start_fraction!r}")
    cut = int(len(text) * start_fraction)
    return text[text.find("\n", cut) + 1 if cut else 0 :]


def _first_line(text: str, max_chars: int) -> str:
    line = text.split("\n", 1)[0]
    if len(line) <= max_chars:
        return line
    return line[:max_chars].rsplit(" ", 1)[0]


def speaker_choice_task(
    text: str, n_items: int = 100, n_choices: int = 4, *, start_fraction: float = HELD_OUT_START, max_chars: int = 40,
    context_chars: int = 60, seed: int = 0,
) -> list:  # fmt: skip
    """``n_items`` items "who speaks next?" from the held-out speeches (chapter "Measuring a model"): the context is
    the end of one speech (its last ``context_chars`` characters, from a word's start) and a blank
    line; the choices are ``"NAME:\\n" + line`` for the true speaker and ``n_choices - 1`` others
    of the held-out part, with the next speech's first line (at most ``max_chars``) in each."""
    check_int(n_items, "n_items")
    check_int(n_choices, "n_choices", minimum=2)
    # a line of verse can end with a colon too: speakers' names are in capitals
    speeches = [s for s in split_speeches(held_out_text(text, start_fraction)) if s.speaker.isupper()]
    names = sorted(Counter(s.speaker for s in speeches))
    if len(names) < n_choices + 1:  # the true speaker and the one before are never a wrong choice
        raise ValueError(f"the held-out text has {len(names)} speakers: n_choices={n_choices} needs "
                         f"{n_choices + 1} (the one before the answer is never offered as a wrong choice)")  # fmt: skip
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a, b in zip(speeches, speeches[1:], strict=False) if a.speaker != b.speaker]
    if len(pairs) < n_items:
        raise ValueError(f"the held-out text has {len(pairs)} changes of speaker, fewer than n_items={n_items}")
    items = []
    for k in sorted(rng.choice(len(pairs), n_items, replace=False)):
        before, speech = pairs[k]
        tail = before.text[-context_chars:]
        context = (tail[tail.find(" ") + 1 :] if len(before.text) > context_chars else tail) + "\n\n"
        line = _first_line(speech.text, max_chars)
        others = [n for n in names if n not in (speech.speaker, before.speaker)]
        wrong = [others[i] for i in rng.choice(len(others), n_choices - 1, replace=False)]
        answer = int(rng.integers(0, n_choices))
        order = wrong[:answer] + [speech.speaker] + wrong[answer:]
        items.append(MCItem(context, tuple(f"{name}:\n{line}" for name in order), answer))
    return items


def cloze_task(
    text: str, n_items: int = 100, n_choices: int = 4, *, start_fraction: float = HELD_OUT_START, seed: int = 0
) -> list:
    """``n_items`` cloze items from the held-out lines (chapter "Measuring a model"): the context is the line before
    and the line with its last word missing; the choices are that word and ``n_choices - 1`` words
    of the held-out text, drawn among those of another length (so the choices' lengths differ)."""
    check_int(n_items, "n_items")
    check_int(n_choices, "n_choices", minimum=2)
    lines = held_out_text(text, start_fraction).split("\n")
    words = sorted({w for w in re.findall(r"[a-z]+", " ".join(lines)) if len(w) >= 2})
    rng = np.random.default_rng(seed)
    found = []
    for prev, line in zip(lines, lines[1:], strict=False):
        m = _WORD.match(line)
        if prev and not prev.endswith(":") and m and len(line.split()) >= 4 and m.group(2).islower():
            found.append((prev, m.group(1), m.group(2)))
    if len(found) < n_items:
        raise ValueError(f"the held-out text has {len(found)} usable lines, fewer than n_items={n_items}")
    most_of_one_length = max(Counter(len(w) for w in words).values(), default=0)
    if len(words) - most_of_one_length < n_choices - 1:  # wrong choices have another length than the answer
        raise ValueError(f"the held-out text has too few words for n_choices={n_choices}: some answers have only "
                         f"{len(words) - most_of_one_length} words of another length to choose from")  # fmt: skip
    items = []
    for k in sorted(rng.choice(len(found), n_items, replace=False)):
        prev, head, word = found[k]
        pool = [w for w in words if len(w) != len(word)]
        wrong = [pool[i] for i in rng.choice(len(pool), n_choices - 1, replace=False)]
        answer = int(rng.integers(0, n_choices))
        items.append(MCItem(f"{prev}\n{head}", tuple(wrong[:answer] + [word] + wrong[answer:]), answer))
    return items


def write_lm_eval_task(items, folder: str | os.PathLike, name: str, *, delimiter: str = " ", force: bool = False):
    """Write ``items`` as ``FOLDER/NAME.jsonl`` and the task ``FOLDER/NAME.yaml`` in ``lm-eval``'s
    format (chapter "Measuring a model"): a multiple-choice task over the file's lines with the metrics ``acc`` and
    ``acc_norm``, each choice scored after ``delimiter``. Existing files are refused unless
    ``force``. Returns the YAML file's path."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"name must be letters, digits and '_', got {name!r}")
    folder = Path(folder)
    data, spec = folder / f"{name}.jsonl", folder / f"{name}.yaml"
    for path in (data, spec):
        if path.exists() and not force:
            raise FileExistsError(f"{path} exists: give force=True to replace it")
    folder.mkdir(parents=True, exist_ok=True)
    items = [MCItem(**it) if isinstance(it, dict) else it for it in items]  # dicts checked as items
    if not items or not all(isinstance(it, MCItem) for it in items):
        kinds = sorted({type(it).__name__ for it in items}) or ["nothing"]
        raise ValueError(f"items must be one or more MCItem (or dicts of their fields), got {', '.join(kinds)}")
    docs = [{"context": it.context, "choices": list(it.choices), "answer": it.answer} for it in items]
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    spec.write_text(
        "\n".join([
            f"task: {name}",
            "dataset_path: json",
            f"dataset_kwargs: {{data_files: {{test: {json.dumps(str(data.resolve()))}}}}}",
            "test_split: test",
            "output_type: multiple_choice",
            "doc_to_text: context",
            "doc_to_choice: choices",
            "doc_to_target: answer",
            f"target_delimiter: {json.dumps(delimiter)}",
            "metric_list:",
            "  - {metric: acc, aggregation: mean, higher_is_better: true}",
            "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}",
            "",
        ]),
        encoding="utf-8",
    )  # fmt: skip
    return spec
