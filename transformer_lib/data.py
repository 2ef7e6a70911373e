"""Data for training: a character tokenizer, synthetic sequence tasks, a dates "translation"
task (chapter 8, "Encoder-decoder and cross-attention") and a text corpus with batch sampling
for a language model (chapter 9, "A GPT from scratch").

Everything is generated offline from a seed, except Tiny Shakespeare, which is read from a local
path or downloaded once into a cache folder; without a network the corpus falls back, with a
warning, to text that every Python installation has: the standard library's own source.

Sequence-to-sequence data use the ids ``pad = 0``, ``bos = 1``, ``eos = 2`` (the defaults of
:class:`~transformer_lib.models.TransformerConfig`): ``src (N, T_src)`` is padded with ``pad``
and ``tgt (N, T_tgt)`` is ``[bos] + answer + [eos] + pads``, so ``tgt[:, :-1]`` is the
decoder's input and ``tgt[:, 1:]`` its target (teacher forcing).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sysconfig
import tempfile
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CACHE_ENV",
    "DATE_FIRST",
    "DATE_FORMATS",
    "DATE_LAST",
    "OFFLINE_ENV",
    "PATH_ENV",
    "SPECIALS",
    "TINY_SHAKESPEARE_SHA256",
    "TINY_SHAKESPEARE_URL",
    "CharTokenizer",
    "ChecksumError",
    "Corpus",
    "LMBatches",
    "Seq2SeqBatches",
    "Seq2SeqData",
    "dates_task",
    "get_batch",
    "load_corpus",
    "pad_sequences",
    "python_stdlib_corpus",
    "render_date",
    "sequence_task",
    "split_tokens",
]

SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2 when given first to CharTokenizer

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
PATH_ENV = "TINY_SHAKESPEARE"  # a local copy of the corpus
OFFLINE_ENV = "ATTENTION_EXECUTED_OFFLINE"  # "1": never download
CACHE_ENV = "ATTENTION_EXECUTED_CACHE"  # the cache folder, if not the default


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


class CharTokenizer:
    """One id per character, optional special tokens first (chapter 8).

    ``CharTokenizer(chars, specials)`` gives the specials ids ``0 .. len(specials) - 1`` and the
    characters the following ids, in the order given; :meth:`from_text` takes the sorted set of a
    text's characters. With ``specials=SPECIALS`` the ids of ``<pad>``, ``<bos>``, ``<eos>`` are 0, 1, 2.
    """

    def __init__(self, chars: Iterable[str], specials: Sequence[str] = ()):
        self.chars, self.specials = tuple(chars), tuple(specials)
        self.itos = self.specials + self.chars
        if any(len(c) != 1 for c in self.chars):
            raise ValueError("every entry of chars must be a single character")
        if len(set(self.itos)) != len(self.itos):
            raise ValueError("characters and special tokens must be distinct")
        self.stoi = {c: i for i, c in enumerate(self.chars, start=len(self.specials))}
        self.special_ids = {s: i for i, s in enumerate(self.specials)}

    @classmethod
    def from_text(cls, text: str, specials: Sequence[str] = ()) -> CharTokenizer:
        """A tokenizer for the sorted set of characters of ``text``."""
        return cls(sorted(set(text)), specials)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("<pad>")

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("<bos>")

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("<eos>")

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """``text`` -> ids; ``bos``/``eos`` add the special tokens around it."""
        try:
            ids = [self.stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the tokenizer's vocabulary") from None
        for flag, name in ((bos, "<bos>"), (eos, "<eos>")):
            if flag and name not in self.special_ids:
                raise ValueError(f"this tokenizer has no {name} token")
        return ([self.special_ids["<bos>"]] if bos else []) + ids + ([self.special_ids["<eos>"]] if eos else [])

    def decode(self, ids: Iterable[int] | Tensor, skip_specials: bool = True) -> str:
        """ids -> text; special tokens are dropped (``skip_specials``) or written as ``<pad>`` etc."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        n = len(self.specials)
        return "".join(self.itos[i] for i in ids if not (skip_specials and i < n))

    def to_dict(self) -> dict:
        """A plain dict (saved in checkpoints); :meth:`from_dict` rebuilds the tokenizer."""
        return {"chars": "".join(self.chars), "specials": list(self.specials)}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        return cls(d["chars"], d["specials"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, specials={list(self.specials)})"


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None) -> Tensor:
    """Lists of ids -> a ``(N, length)`` LongTensor padded on the right (default: the longest)."""
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = np.full((len(seqs), length), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has length {len(s)} > {length}")
        out[i, : len(s)] = s
    return torch.from_numpy(out)


# ---------------------------------------------------------------------------------------------
# Sequence-to-sequence tasks (chapter 8)
# ---------------------------------------------------------------------------------------------


@dataclass
class Seq2SeqData:
    """A sequence-to-sequence task split into training and validation examples that never overlap.

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
    def max_len(self) -> int:
        """The longest sequence a model must accept: ``max(T_src, T_tgt)``."""
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
    """Synthetic task ``"copy"``, ``"reverse"`` or ``"sort"`` on random sequences (chapter 8).

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


_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")  # fmt: skip
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# Human ways to write a date, lower-cased. Two-digit years follow the POSIX rule that
# ``datetime.strptime`` uses (69-99 -> 19xx, 00-68 -> 20xx), so every string names one date.
DATE_FORMATS: dict[str, Callable[[datetime.date], str]] = {
    "d month yyyy": lambda d: f"{d.day} {_MONTHS[d.month - 1]} {d.year}",  # 21 november 2026
    "mon d, yyyy": lambda d: f"{_MONTHS[d.month - 1][:3]} {d.day}, {d.year}",  # nov 21, 2026
    "dd/mm/yy": lambda d: f"{d.day:02d}/{d.month:02d}/{d.year % 100:02d}",  # 21/11/26
    "weekday the dth of month yyyy": lambda d: (
        f"{_WEEKDAYS[d.weekday()]} the {_ordinal(d.day)} of {_MONTHS[d.month - 1]} {d.year}"
    ),  # saturday the 21st of november 2026
    "yyyy.mm.dd": lambda d: f"{d.year}.{d.month:02d}.{d.day:02d}",  # 2026.11.21
    "month dth yyyy": lambda d: f"{_MONTHS[d.month - 1]} {_ordinal(d.day)} {d.year}",  # november 21st 2026
    "mm/dd/yyyy": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",  # 11/21/2026
    "wkd, d mon yyyy": lambda d: f"{_WEEKDAYS[d.weekday()][:3]}, {d.day} {_MONTHS[d.month - 1][:3]} {d.year}",
    "dd.mm.yyyy": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",  # 21.11.2026
    "weekday, month d, yyyy": lambda d: f"{_WEEKDAYS[d.weekday()]}, {_MONTHS[d.month - 1]} {d.day}, {d.year}",
    "d mon yy": lambda d: f"{d.day} {_MONTHS[d.month - 1][:3]} {d.year % 100:02d}",  # 21 nov 26
    "yyyymmdd": lambda d: f"{d.year}{d.month:02d}{d.day:02d}",  # 20261121
    "the dth of month, yyyy": lambda d: f"the {_ordinal(d.day)} of {_MONTHS[d.month - 1]}, {d.year}",
}
_DATE_CHARS = "".join(sorted(set("".join(_MONTHS + _WEEKDAYS) + "the of stndrdth 0123456789,./")))
DATE_FIRST, DATE_LAST = datetime.date(1969, 1, 1), datetime.date(2068, 12, 31)


def render_date(date: datetime.date, fmt: str) -> str:
    """``date`` written in the format named ``fmt`` (a key of :data:`DATE_FORMATS`)."""
    return DATE_FORMATS[fmt](date)


def dates_task(n_train: int = 50_000, n_val: int = 1_000, seed: int = 0) -> Seq2SeqData:
    """Translate dates written in :data:`DATE_FORMATS` to ISO ``yyyy-mm-dd`` (chapter 8).

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


# ---------------------------------------------------------------------------------------------
# A text corpus for the language model (chapter 9)
# ---------------------------------------------------------------------------------------------


class ChecksumError(ValueError):
    """A downloaded file does not have the expected SHA-256; it was not kept."""


@dataclass
class Corpus:
    """A text and where it came from: ``name`` is ``"tiny_shakespeare"``, ``"python_stdlib"`` or a file's name."""

    text: str
    name: str
    source: str


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-executed"


def _offline() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fetch(url: str, timeout: float) -> bytes:
    """The bytes at ``url`` (a separate function so tests can replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _download(url: str, dest: Path, sha256: str, timeout: float) -> Path:
    """Download ``url`` to ``dest`` atomically; a checksum mismatch raises and keeps nothing."""
    data = _fetch(url, timeout)
    if _sha256(data) != sha256:
        raise ChecksumError(
            f"the file downloaded from {url} has SHA-256 {_sha256(data)}, expected {sha256}; it was not kept. "
            f"Download it yourself and pass its path (or set {PATH_ENV}=/path/to/input.txt)."
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def python_stdlib_corpus(n_chars: int = 1_000_000) -> str:
    """About ``n_chars`` of Python source: the standard library's top-level ``.py`` files that are
    pure ASCII, in sorted order. Every Python installation has it, so it is the offline fallback."""
    text, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            part = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        text.append(part)
        total += len(part)
        if total >= n_chars:
            break
    corpus = "".join(text)[:n_chars]
    if len(corpus) < 10_000:
        raise RuntimeError("this Python installation has too little standard-library source for a fallback corpus")
    return corpus


def load_corpus(
    path: str | os.PathLike | None = None,
    *,
    offline: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
) -> Corpus:
    """The language model's text (chapter 9): Tiny Shakespeare if it can be had, else a fallback.

    In order: the file ``path`` (any text); the file named by the environment variable
    ``TINY_SHAKESPEARE``; a verified copy in the cache folder (``$ATTENTION_EXECUTED_CACHE``, else
    ``$XDG_CACHE_HOME/attention-executed`` or ``~/.cache/attention-executed``); a download (at
    most ``timeout`` seconds; skipped when ``offline`` or ``ATTENTION_EXECUTED_OFFLINE=1``),
    checked against :data:`TINY_SHAKESPEARE_SHA256`. When none works, a warning and
    :func:`python_stdlib_corpus`. A download with the wrong checksum raises :class:`ChecksumError`.
    """
    if path is not None:
        path = Path(path)
        return Corpus(path.read_text(encoding="utf-8"), path.stem, str(path))
    if os.environ.get(PATH_ENV):
        path = Path(os.environ[PATH_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{PATH_ENV}={path} does not name a file")
        data = path.read_bytes()
        if _sha256(data) != TINY_SHAKESPEARE_SHA256:
            warnings.warn(f"{PATH_ENV}={path} is not the expected Tiny Shakespeare (checksum differs)", stacklevel=2)
        return Corpus(data.decode("utf-8"), "tiny_shakespeare", str(path))
    cached = Path(cache_dir or _cache_dir()) / "tinyshakespeare.txt"
    if cached.is_file():
        data = cached.read_bytes()
        if _sha256(data) == TINY_SHAKESPEARE_SHA256:
            return Corpus(data.decode("utf-8"), "tiny_shakespeare", str(cached))
        warnings.warn(f"removing {cached}: its checksum is wrong", stacklevel=2)
        cached.unlink()
    offline = _offline() if offline is None else offline
    reason = f"downloads are disabled ({OFFLINE_ENV}=1 or offline=True)"
    if not offline:
        try:
            _download(TINY_SHAKESPEARE_URL, cached, TINY_SHAKESPEARE_SHA256, timeout)
            return Corpus(cached.read_text(encoding="utf-8"), "tiny_shakespeare", str(cached))
        except ChecksumError:
            raise
        except OSError as e:  # no network, a timeout, an HTTP error, a read-only cache...
            reason = f"the download failed ({e})"
    text = python_stdlib_corpus()
    warnings.warn(
        f"Tiny Shakespeare is not available: {reason}. Using the offline fallback corpus instead: "
        f"{len(text):,} characters of the Python standard library's source. To use Tiny Shakespeare, set "
        f"{PATH_ENV}=/path/to/input.txt or allow one download from {TINY_SHAKESPEARE_URL}.",
        stacklevel=2,
    )
    return Corpus(text, "python_stdlib", sysconfig.get_paths()["stdlib"])


def split_tokens(tokens: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """A token stream ``(N,)`` -> (first ``1 - val_fraction``, last ``val_fraction``): never overlapping."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_train = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:n_train], tokens[n_train:]


def _to_device(t: Tensor, device: torch.device | str) -> Tensor:
    device = torch.device(device)
    if device.type == "cuda":  # pinned memory lets the copy overlap with the GPU's work
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _windows(data: Tensor, starts: Tensor, block_size: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    offsets = starts[:, None] + torch.arange(block_size)  # (B, T)
    return _to_device(data[offsets], device), _to_device(data[offsets + 1], device)


def get_batch(
    data: Tensor,
    block_size: int,
    batch_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of a token stream ``data (N,)`` (chapter 9).

    Returns ``x (B, T)`` and ``y (B, T)`` on ``device`` with ``T = block_size``; ``y`` is ``x``
    shifted by one position in the stream, so ``y[:, t]`` is the token that follows ``x[:, t]``.
    """
    if len(data) <= block_size:
        raise ValueError(f"the data has {len(data)} tokens, need more than block_size={block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
    return _windows(data, starts, block_size, device)


class _Batches:
    """Shared part of the batch samplers: one seeded generator per split, and ranks.

    With ``world_size`` processes (data-parallel training) every rank draws the same global batch
    of ``world_size * batch_size`` rows and keeps its own slice, so together the ranks see
    exactly the batch one process would see with ``world_size`` times the batch size.
    """

    def __init__(self, batch_size: int, device, seed: int, rank: int, world_size: int):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.batch_size, self.device, self.rank, self.world_size = batch_size, torch.device(device), rank, world_size
        self.generators = {s: torch.Generator().manual_seed(seed + i) for i, s in enumerate(("train", "val"))}

    def _check_split(self, split: str) -> None:
        if split not in self.generators:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")

    def _rows(self, split: str, n: int) -> Tensor:
        """This rank's ``batch_size`` random row indices in ``[0, n)``."""
        rows = torch.randint(n, (self.world_size * self.batch_size,), generator=self.generators[split])
        return rows[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def state_dict(self) -> dict:
        """The generators' states (saved in checkpoints, so a resumed run draws the same batches)."""
        return {s: g.get_state() for s, g in self.generators.items()}

    def load_state_dict(self, state: dict) -> None:
        for s, g in self.generators.items():
            g.set_state(state[s])


class LMBatches(_Batches):
    """Language-model batches from a training and a validation token stream (chapter 9).

    ``batches("train")`` or ``batches("val")`` returns ``(x (B, T), y (B, T))`` as
    :func:`get_batch` does, each split with its own seeded generator.
    """

    def __init__(
        self,
        train: Tensor,
        val: Tensor,
        block_size: int,
        batch_size: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__(batch_size, device, seed, rank, world_size)
        for name, data in (("train", train), ("val", val)):
            if len(data) <= block_size:
                raise ValueError(f"the {name} split has {len(data)} tokens, need more than block_size={block_size}")
        self.data, self.block_size = {"train": train, "val": val}, block_size

    def __call__(self, split: str = "train") -> tuple[Tensor, Tensor]:
        self._check_split(split)
        data = self.data[split]
        starts = self._rows(split, len(data) - self.block_size)  # (B,)
        return _windows(data, starts, self.block_size, self.device)


class Seq2SeqBatches(_Batches):
    """Random batches of a :class:`Seq2SeqData` for teacher forcing (chapter 8).

    ``batches("train")`` returns ``(src (B, T_src), tgt_in (B, T_tgt - 1), tgt_out (B, T_tgt - 1))``,
    the arguments of ``Transformer.forward(src, tgt, targets)``.
    """

    def __init__(
        self,
        data: Seq2SeqData,
        batch_size: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__(batch_size, device, seed, rank, world_size)
        self.splits = {"train": (data.train_src, data.train_tgt), "val": (data.val_src, data.val_tgt)}

    def __call__(self, split: str = "train") -> tuple[Tensor, Tensor, Tensor]:
        self._check_split(split)
        src, tgt = self.splits[split]
        rows = self._rows(split, len(src))  # (B,)
        src, tgt = _to_device(src[rows], self.device), _to_device(tgt[rows], self.device)
        return src, tgt[:, :-1], tgt[:, 1:]
