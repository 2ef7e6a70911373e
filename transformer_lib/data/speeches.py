"""Labelled tasks from the shipped text (chapter "Fine-tuning"): Tiny Shakespeare is a
sequence of speeches, each under its speaker's name, so every speech carries a label.

:func:`split_speeches` splits a text into :class:`Speech` records; :func:`speaker_task` picks the
speeches of the most frequent speakers of one part of the text and splits them, stratified by
speaker, into a training and a test set; :func:`word_order_task` labels each speech as it is
(1) or with the words of each line shuffled (0), a task that only knowledge of the language
solves. :func:`encode_texts` turns texts into the padded id tensor and lengths a classifier reads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int, is_int

__all__ = ["LabelledTexts", "Speech", "encode_texts", "speaker_task", "split_speeches", "word_order_task"]

# a speaker's name on a line of its own, ending with a colon: "KING RICHARD III:"
_SPEAKER = re.compile(r"^([A-Z][A-Za-z' ]*[A-Za-z]):\n", re.MULTILINE)


@dataclass(frozen=True)
class Speech:
    """One speech: its ``speaker``, its ``text`` (the lines under the name) and the character
    offset ``start`` of the speaker's name in the whole text (chapter "Fine-tuning")."""

    speaker: str
    text: str
    start: int


@dataclass
class LabelledTexts:
    """A classification task (chapter "Fine-tuning"): ``texts`` with integer ``labels`` (``0 .. len(classes) - 1``),
    split into ``train`` and ``test`` index lists, and the ``classes``' names; checked when made."""

    texts: list[str]
    labels: list[int]
    classes: list[str]
    train: list[int]
    test: list[int]

    def __post_init__(self):
        """One label per text, each a class's index; the splits index the texts."""
        if len(self.labels) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels: give one label per text")
        n = len(self.classes)
        if bad := [y for y in self.labels if not (is_int(y) and 0 <= y < n)]:
            raise ValueError(f"labels must be ints in [0, {n}) (the classes {self.classes}), got {bad[0]!r}")
        for part in ("train", "test"):
            if bad := [i for i in getattr(self, part) if not (is_int(i) and 0 <= i < len(self.texts))]:
                raise ValueError(f"the {part} split holds {bad[0]!r}, not an index of the {len(self.texts)} texts")

    def split(self, part: str) -> tuple[list[str], list[int]]:
        """``(texts, labels)`` of ``part``, ``"train"`` or ``"test"``."""
        if part not in ("train", "test"):
            raise ValueError(f"part must be 'train' or 'test', got {part!r}")
        rows = self.train if part == "train" else self.test
        return [self.texts[i] for i in rows], [self.labels[i] for i in rows]


def split_speeches(text: str) -> list[Speech]:
    """Every speech of ``text``, in order: a speaker's name alone on a line, ending with ``:``,
    then the lines up to the next blank line (chapter "Fine-tuning")."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out = []
    for m in _SPEAKER.finditer(text):
        end = text.find("\n\n", m.end())
        body = text[m.end() : len(text) if end < 0 else end].strip("\n")
        if body:
            out.append(Speech(m.group(1), body, m.start()))
    return out


def _stratified(labels: list[int], test_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Each class's rows shuffled with ``seed``, the first ``test_fraction`` of each to the test set."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in sorted(set(labels)):
        rows = [i for i, y in enumerate(labels) if y == c]
        rows = [rows[i] for i in rng.permutation(len(rows))]
        k = round(len(rows) * test_fraction)
        test += rows[:k]
        train += rows[k:]
    return sorted(train), sorted(test)


def _check_fraction(value: float, name: str) -> None:
    if not isinstance(value, float) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a float between 0 and 1, got {value!r}")


def speaker_task(
    text: str, n_speakers: int = 5, *, start_fraction: float = 0.9, test_fraction: float = 0.4, seed: int = 0
) -> LabelledTexts:
    """Who speaks? The speeches of the ``n_speakers`` most frequent speakers among those that start
    at or after ``start_fraction`` of ``text`` (by default the last 10 %, the part the training
    command holds out for validation, so a model pretrained on the rest never saw them), split
    per speaker with ``test_fraction`` of each speaker's speeches in the test set (chapter "Fine-tuning")."""
    check_int(n_speakers, "n_speakers", minimum=2)
    _check_fraction(start_fraction, "start_fraction")
    _check_fraction(test_fraction, "test_fraction")
    cut = int(len(text) * start_fraction)
    part = [s for s in split_speeches(text) if s.start >= cut]
    counts = Counter(s.speaker for s in part).most_common()
    if len(counts) < n_speakers:
        raise ValueError(f"the text after {start_fraction:.0%} has {len(counts)} speakers, fewer than {n_speakers}")
    classes = [name for name, _ in counts[:n_speakers]]
    chosen = [s for s in part if s.speaker in classes]
    labels = [classes.index(s.speaker) for s in chosen]
    train, test = _stratified(labels, test_fraction, seed)
    return LabelledTexts([s.text for s in chosen], labels, classes, train, test)


def _shuffle_words(text: str, rng: np.random.Generator) -> str:
    """``text`` with the words of each line in a random order other than their own, where a line
    has two different words or more."""
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        if len(set(words)) > 1:
            order = rng.permutation(len(words))
            while [words[i] for i in order] == words:
                order = rng.permutation(len(words))
            words = [words[i] for i in order]
        lines.append(" ".join(words))
    return "\n".join(lines)


def word_order_task(
    text: str, n_speeches: int = 400, *, start_fraction: float = 0.9, test_fraction: float = 0.5, seed: int = 0
) -> LabelledTexts:
    """Is the word order real? ``n_speeches`` speeches drawn with ``seed`` from those that start at
    or after ``start_fraction`` of ``text``; half, at random, keep their words (label 1,
    ``"real"``) and half have the words of every line shuffled (label 0, ``"shuffled"``) (chapter "Fine-tuning"). Only
    speeches of ten words or more are drawn. The same letters, spaces and words are in both
    classes: a model must know which orders English allows."""
    check_int(n_speeches, "n_speeches", minimum=4)
    _check_fraction(start_fraction, "start_fraction")
    _check_fraction(test_fraction, "test_fraction")
    cut = int(len(text) * start_fraction)
    part = [s.text for s in split_speeches(text) if s.start >= cut and len(s.text.split()) >= 10]
    if len(part) < n_speeches:
        raise ValueError(f"the text after {start_fraction:.0%} has {len(part)} speeches of ten words, not {n_speeches}")
    rng = np.random.default_rng(seed)
    chosen = [part[i] for i in sorted(rng.choice(len(part), n_speeches, replace=False))]
    labels = [int(v) for v in rng.permutation(np.arange(n_speeches) % 2)]
    texts = [t if y == 1 else _shuffle_words(t, rng) for t, y in zip(chosen, labels, strict=True)]
    train, test = _stratified(labels, test_fraction, seed)
    return LabelledTexts(texts, labels, ["shuffled", "real"], train, test)


def encode_texts(tokenizer, texts: list[str], context_len: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """``(ids (N, context_len), lengths (N,))``: each text's first ``context_len`` tokens, padded
    on the right with ``pad_id``; ``lengths`` counts the real tokens (at least 1) (chapter "Fine-tuning")."""
    check_int(context_len, "context_len")
    rows, lengths = [], []
    for text in texts:
        ids = tokenizer.encode(text)[:context_len]
        if not ids:
            raise ValueError("a text encodes to no token: an empty text cannot be classified")
        lengths.append(len(ids))
        rows.append(ids + [pad_id] * (context_len - len(ids)))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(lengths, dtype=torch.long)
