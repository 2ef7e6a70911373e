"""Sequence-to-sequence tasks (chapter "Encoder-decoder and cross-attention"):
copy, reverse and sort random sequences, and translate dates written in many human formats to ISO.

Ids ``pad = 0``, ``bos = 1``, ``eos = 2`` (the defaults of
:class:`~transformer_lib.encoder_decoder.TransformerConfig`): ``src (N, T_src)`` is padded with ``pad``
and ``tgt (N, T_tgt)`` is ``[bos] + answer + [eos] + pads``, so ``tgt[:, :-1]`` is the
decoder's input and ``tgt[:, 1:]`` its target (teacher forcing).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .tokenizer import SPECIALS, CharTokenizer, pad_sequences

__all__ = [
    "DATE_FIRST",
    "DATE_FORMATS",
    "DATE_LAST",
    "DATE_PIECES",
    "ISO_FIELDS",
    "Seq2SeqData",
    "date_field_shares",
    "date_field_spans",
    "date_format_of",
    "dates_task",
    "render_date",
    "sequence_task",
]


@dataclass
class Seq2SeqData:
    """A sequence-to-sequence task split into training and validation examples that never overlap (chapter
    "Encoder-decoder and cross-attention").

    ``*_src`` are ``(N, T_src)`` and ``*_tgt`` ``(N, T_tgt)`` LongTensors (see the module's
    docstring for the layout); the tokenizers turn rows back into text.
    """

    train_src: Tensor  # (N_train, T_src)
    train_tgt: Tensor  # (N_train, T_tgt)
    val_src: Tensor  # (N_val, T_src)
    val_tgt: Tensor  # (N_val, T_tgt)
    src_tokenizer: CharTokenizer
    tgt_tokenizer: CharTokenizer

    @property
    def context_len(self) -> int:
        """The longest sequence a model must accept: ``max(T_src, T_tgt)`` (the model's ``context_len``)."""
        return max(self.train_src.shape[1], self.train_tgt.shape[1])


def _seq2seq(src: list[list[int]], answers: list[list[int]], n_train: int) -> tuple[Tensor, ...]:
    """Pad sources and ``[bos] + answer + [eos]`` targets; the first ``n_train`` rows are training."""
    src_t = pad_sequences(src)  # (N, T_src)
    tgt_t = pad_sequences([[SPECIALS.index("<bos>"), *a, SPECIALS.index("<eos>")] for a in answers])  # (N, T_tgt)
    return src_t[:n_train], tgt_t[:n_train], src_t[n_train:], tgt_t[n_train:]


_TASKS: dict[str, Callable[[list[int]], list[int]]] = {"copy": list, "reverse": lambda s: s[::-1], "sort": sorted}
_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def sequence_task(
    task: str,
    n_train: int = 10_000,
    n_val: int = 1_000,
    n_symbols: int = 10,
    min_len: int = 1,
    max_len: int = 10,
    seed: int = 0,
) -> Seq2SeqData:
    """Synthetic task ``"copy"``, ``"reverse"`` or ``"sort"`` on random sequences (chapter "Encoder-decoder and
    cross-attention").

    Sources are distinct random sequences of ``min_len .. max_len`` symbols with ids
    ``3 .. 3 + n_symbols - 1`` (shown as ``0-9a-z...`` by the tokenizers), so no validation
    example appears in training. The answer is the source copied, reversed or sorted.
    """
    if task not in _TASKS:
        raise ValueError(f"task must be one of {sorted(_TASKS)}, got {task!r}")
    if not 1 <= n_symbols <= len(_SYMBOLS) or not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= n_symbols <= {len(_SYMBOLS)} and 1 <= min_len <= max_len")
    n = n_train + n_val
    if sum(n_symbols**L for L in range(min_len, max_len + 1)) < n:
        raise ValueError(f"{n_symbols} symbols, lengths {min_len}..{max_len}: fewer than {n} distinct sequences")
    rng = np.random.default_rng(seed)
    seen: dict[tuple[int, ...], None] = {}  # insertion-ordered set
    while len(seen) < n:
        L = int(rng.integers(min_len, max_len + 1))
        seen.setdefault(tuple((rng.integers(0, n_symbols, L) + len(SPECIALS)).tolist()), None)
    src = [list(s) for s in seen]
    tokenizer = CharTokenizer(_SYMBOLS[:n_symbols], SPECIALS)
    return Seq2SeqData(*_seq2seq(src, [_TASKS[task](s) for s in src], n_train), tokenizer, tokenizer)


_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

# The pieces a date format is written with, each naming the field of the date it shows.
DATE_PIECES = {
    "weekday": "weekday",
    "wkd": "weekday",
    "month": "month",
    "mon": "month",
    "mm": "month",
    "yyyy": "year",
    "yy": "year",
    "dth": "day",
    "dd": "day",
    "d": "day",
}
_PIECE = re.compile("|".join(DATE_PIECES))  # longest names first: "month" before "mon", "dth" before "d"


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _piece_text(piece: str, d: datetime.date) -> str:
    month, weekday = _MONTHS[d.month - 1], _WEEKDAYS[d.weekday()]
    return {
        "weekday": weekday,
        "wkd": weekday[:3],
        "month": month,
        "mon": month[:3],
        "mm": f"{d.month:02d}",
        "yyyy": str(d.year),
        "yy": f"{d.year % 100:02d}",
        "dth": _ordinal(d.day),
        "dd": f"{d.day:02d}",
        "d": str(d.day),
    }[piece]


# Human ways to write a date, lower-cased, each a pattern of DATE_PIECES and literal text. Two-digit
# years follow the POSIX rule that ``datetime.strptime`` uses (69-99 -> 19xx, 00-68 -> 20xx), so
# every string names one date.
DATE_FORMATS = (
    "d month yyyy",  # 21 november 2026
    "mon d, yyyy",  # nov 21, 2026
    "dd/mm/yy",  # 21/11/26
    "weekday the dth of month yyyy",  # saturday the 21st of november 2026
    "yyyy.mm.dd",  # 2026.11.21
    "month dth yyyy",  # november 21st 2026
    "mm/dd/yyyy",  # 11/21/2026
    "wkd, d mon yyyy",  # sat, 21 nov 2026
    "dd.mm.yyyy",  # 21.11.2026
    "weekday, month d, yyyy",  # saturday, november 21, 2026
    "d mon yy",  # 21 nov 26
    "yyyymmdd",  # 20261121
    "the dth of month, yyyy",  # the 21st of november, 2026
)
_DATE_CHARS = "".join(sorted(set("".join(_MONTHS + _WEEKDAYS) + "the of stndrdth 0123456789,./")))
DATE_FIRST, DATE_LAST = datetime.date(1969, 1, 1), datetime.date(2068, 12, 31)


def date_field_spans(date: datetime.date, fmt: str) -> tuple[str, dict[str, range]]:
    """``date`` written in the format ``fmt``, and where each field landed (chapter "Encoder-decoder and
    cross-attention").

    Returns ``(text, spans)``: ``spans["day"]``, ``["month"]``, ``["year"]`` (and ``["weekday"]``
    where the format shows it) are the ranges of character positions of ``text`` that show that
    field, for example to ask which source characters cross-attention reads.
    """
    text, spans, last = "", {}, 0
    for m in _PIECE.finditer(fmt):
        text += fmt[last : m.start()]  # literal text between fields: " ", ", ", "/", "the ", ...
        piece = _piece_text(m.group(), date)
        spans[DATE_PIECES[m.group()]] = range(len(text), len(text) + len(piece))
        text += piece
        last = m.end()
    return text + fmt[last:], spans


def render_date(date: datetime.date, fmt: str) -> str:
    """``date`` written in the format ``fmt``, one of :data:`DATE_FORMATS` (chapter "Encoder-decoder and
    cross-attention")."""
    if fmt not in DATE_FORMATS:
        raise ValueError(f"fmt must be one of DATE_FORMATS, got {fmt!r}")
    return date_field_spans(date, fmt)[0]


def date_format_of(text: str, date: datetime.date) -> str:
    """The name of the format in :data:`DATE_FORMATS` that writes ``date`` as ``text`` (chapter "Encoder-decoder and
    cross-attention")."""
    found = next((f for f in DATE_FORMATS if render_date(date, f) == text), None)
    if found is None:
        raise ValueError(f"no format in DATE_FORMATS writes {date.isoformat()} as {text!r}")
    return found


def dates_task(n_train: int = 50_000, n_val: int = 1_000, seed: int = 0) -> Seq2SeqData:
    """Translate dates written in :data:`DATE_FORMATS` to ISO ``yyyy-mm-dd`` (chapter "Encoder-decoder and
    cross-attention").

    Dates lie between 1969-01-01 and 2068-12-31. ``n_val`` of them, drawn with ``seed``, are held
    out: each appears once in validation, in a random format, and never in training. Training
    examples are ``n_train`` distinct (date, format) pairs of the other dates. Character level:
    the source vocabulary is lower-case letters, digits, space and ``,./`` (plus the specials);
    the target vocabulary is digits and ``-``.
    """
    n_days = (DATE_LAST - DATE_FIRST).days + 1
    n_formats = len(DATE_FORMATS)
    if n_val >= n_days or n_train > (n_days - n_val) * n_formats:
        raise ValueError(f"at most {n_days - 1} held-out dates and {n_formats} formats per training date")
    rng = np.random.default_rng(seed)
    days = rng.permutation(n_days)
    val_days, train_days = days[:n_val], days[n_val:]
    pairs = rng.choice(len(train_days) * n_formats, size=n_train, replace=False)  # distinct (date, format)
    days_and_formats = [(int(train_days[p // n_formats]), int(p % n_formats)) for p in pairs]
    days_and_formats += [(int(d), int(f)) for d, f in zip(val_days, rng.integers(0, n_formats, n_val), strict=True)]
    names = list(DATE_FORMATS)
    src_tok, tgt_tok = CharTokenizer(_DATE_CHARS, SPECIALS), CharTokenizer("-0123456789", SPECIALS)
    src, answers = [], []
    for day, f in days_and_formats:
        date = DATE_FIRST + datetime.timedelta(days=day)
        src.append(src_tok.encode(render_date(date, names[f])))
        answers.append(tgt_tok.encode(date.isoformat()))
    return Seq2SeqData(*_seq2seq(src, answers, n_train), src_tok, tgt_tok)


#: The field each output position of an ISO date ``yyyy-mm-dd`` and its ``<eos>`` writes (None: no field).
ISO_FIELDS = ("year",) * 4 + (None,) + ("month",) * 2 + (None,) + ("day",) * 2 + (None,)


def date_field_shares(cross: Tensor, texts: Sequence[str], formats: Sequence[str], dates: Sequence) -> dict:
    """How much cross-attention weight lands on the date field being written (chapter "Encoder-decoder and
    cross-attention").

    ``cross`` is ``(N, layers, h, T_tgt, T_src)``: the weights of a teacher-forced pass whose
    output row ``t`` writes character ``t`` of the ISO answer; ``texts[n]`` is source ``n``,
    ``dates[n]`` written in ``formats[n]``. For each of the 8 digit rows (:data:`ISO_FIELDS`) the
    weight on the source characters of its field is summed. Returns ``"share"``
    ``(N, layers, h, 8)``; ``"per_head"`` ``(layers, h)``, its mean over dates and digits;
    ``"per_field"`` ``(3, layers, h)``, the mean over the digits of the year, month and day;
    ``"uniform"``, what weight spread evenly over each source's characters would score for
    ``"per_head"``, and ``"uniform_per_field"`` ``(3,)``, what it would score for each field of
    ``"per_field"`` (a long month name takes more of the source than a one-digit day).
    """
    if cross.ndim != 5:
        raise ValueError(f"cross must have shape (N, layers, h, T_tgt, T_src), got {tuple(cross.shape)}")
    n = cross.shape[0]
    if not len(texts) == len(formats) == len(dates) == n:
        raise ValueError(
            f"texts, formats and dates need one entry per row of cross ({n}), "
            f"got {len(texts)}, {len(formats)} and {len(dates)}"
        )
    if cross.shape[3] < len(ISO_FIELDS) - 1:
        raise ValueError(f"cross has {cross.shape[3]} output rows; an ISO date needs {len(ISO_FIELDS) - 1}")
    digit_rows = [t for t, f in enumerate(ISO_FIELDS) if f]
    right = torch.zeros(n, len(digit_rows), cross.shape[-1], dtype=cross.dtype)
    fields = ("year", "month", "day")
    uniform = torch.zeros(n, len(fields), dtype=torch.float64)  # each field's share of the source
    for i, (text, fmt, date) in enumerate(zip(texts, formats, dates, strict=True)):
        rendered, spans = date_field_spans(date, fmt)
        if rendered != text:
            raise ValueError(f"texts[{i}] = {text!r} is not {date} written as {fmt!r} ({rendered!r})")
        for r, t in enumerate(digit_rows):
            right[i, r, list(spans[ISO_FIELDS[t]])] = 1.0
        uniform[i] = torch.tensor([len(spans[f]) / len(text) for f in fields], dtype=torch.float64)
    share = (cross[:, :, :, digit_rows, :] * right[:, None, None]).sum(-1)  # (N, layers, h, 8)
    rows = [[r for r, t in enumerate(digit_rows) if ISO_FIELDS[t] == f] for f in fields]
    digits = torch.tensor([len(r) for r in rows], dtype=torch.float64)  # (3,): 4, 2 and 2 digits
    return {
        "share": share,
        "per_head": share.mean(dim=(0, 3)),
        "per_field": torch.stack([share[..., r].mean(dim=(0, 3)) for r in rows]),
        "uniform": (uniform.mean(0) @ digits / digits.sum()).item(),
        "uniform_per_field": uniform.mean(0),
    }
