"""A character tokenizer and padding (chapter "Encoder-decoder and cross-attention", "Encoder-decoder and
cross-attention"), and tokenizer files for either kind, character or byte-level BPE (chapter "Tokens")."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._checks import is_int
from ..bpe import BPETokenizer
from ..utils import atomic_write

__all__ = [
    "SPECIALS",
    "TOKENIZER_FORMAT",
    "CharTokenizer",
    "load_tokenizer",
    "pad_sequences",
    "save_tokenizer",
    "tokenizer_checksum",
    "tokenizer_from_dict",
]

SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2 when given first to CharTokenizer


class CharTokenizer:
    """One id per character, optional special tokens first (chapter "Encoder-decoder and cross-attention").

    ``CharTokenizer(chars, specials)`` gives the specials ids ``0 .. len(specials) - 1`` and the
    characters the following ids, in the order given; :meth:`from_text` takes the sorted set of a
    text's characters. With ``specials=SPECIALS`` the ids of ``<pad>``, ``<bos>``, ``<eos>`` are 0, 1, 2.
    """

    kind = "char"

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
            if ids.dim() != 1:
                raise ValueError(
                    f"decode takes one sequence of ids (T,), got a tensor of shape {tuple(ids.shape)}: "
                    f"decode one row, for example tokenizer.decode(ids[0])"
                )
            ids = ids.tolist()
        ids = list(ids)
        V = self.vocab_size
        for i in ids:
            if isinstance(i, (list, tuple)):
                raise ValueError(
                    "decode takes one sequence of ids, got a nested list: decode one row, for example ids[0]"
                )
            if not is_int(i):
                raise TypeError(f"token ids must be ints, got {i!r} ({type(i).__name__})")
            if not 0 <= i < V:
                raise ValueError(f"token id {i} is outside the vocabulary [0, vocab_size={V})")
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
    """Lists of ids -> a ``(N, length)`` LongTensor padded on the right (default: the longest; chapter "Encoder-decoder
    and cross-attention")."""
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = np.full((len(seqs), length), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has length {len(s)} > {length}")
        out[i, : len(s)] = s
    return torch.from_numpy(out)


TOKENIZER_FORMAT = ("attention-executed-tokenizer", 1)  # a tokenizer file's "format" and "version"


def tokenizer_from_dict(d: dict) -> CharTokenizer | BPETokenizer:
    """The tokenizer a ``to_dict()`` describes, of either kind (chapter "Tokens"); a dict without a
    ``"kind"`` is a character tokenizer's (as checkpoints saved before chapter "Tokens" hold)."""
    if not isinstance(d, dict):
        raise TypeError(f"a tokenizer is described by a dict, got {type(d).__name__}")
    kind = d.get("kind", "char")
    if kind == "char":
        return CharTokenizer.from_dict(d)
    if kind == "bpe":
        return BPETokenizer.from_dict(d)
    raise ValueError(f"unknown tokenizer kind {kind!r}: this library knows 'char' and 'bpe'")


def tokenizer_checksum(tokenizer: CharTokenizer | BPETokenizer) -> str:
    """The SHA-256 of a tokenizer's settings (its ``to_dict()`` as sorted JSON; chapter "Tokens"): two
    tokenizers that encode alike have the same checksum, and any other one a different checksum."""
    d = tokenizer.to_dict()
    if isinstance(tokenizer, BPETokenizer):
        d = {**d, "pattern": tokenizer.pattern}  # a named pattern counts by its text
    return hashlib.sha256(json.dumps(d, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def save_tokenizer(tokenizer: CharTokenizer | BPETokenizer, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``tokenizer`` to one small JSON file, versioned and checksummed (chapter "Tokens"), in one
    atomic step. An existing file is kept unless it holds the same tokenizer or ``force=True``."""
    if not isinstance(tokenizer, (CharTokenizer, BPETokenizer)):
        raise TypeError(f"tokenizer must be a CharTokenizer or a BPETokenizer, got {type(tokenizer).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{path} is a folder: give the tokenizer file's path, for example {path / 'tokenizer.json'}"
        )
    if path.exists() and not force:
        try:
            same = load_tokenizer(path) == tokenizer
        except (ValueError, OSError):
            same = False
        if not same:
            raise FileExistsError(f"{path} already exists and holds something else: pass force=True to replace it")
    payload = {
        "format": TOKENIZER_FORMAT[0],
        "version": TOKENIZER_FORMAT[1],
        "tokenizer": tokenizer.to_dict(),
        "sha256": tokenizer_checksum(tokenizer),
    }
    text = json.dumps(payload, ensure_ascii=True, separators=(",", ":")) + "\n"
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def load_tokenizer(path: str | os.PathLike) -> CharTokenizer | BPETokenizer:
    """Read a file written by :func:`save_tokenizer` (chapter "Tokens"), checking its format, version and
    checksum; a damaged or foreign file raises ``ValueError`` naming the file."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a tokenizer file (not JSON: {e})") from None
    if not isinstance(payload, dict) or payload.get("format") != TOKENIZER_FORMAT[0]:
        raise ValueError(f"{path} is not a tokenizer file of this library (no format {TOKENIZER_FORMAT[0]!r})")
    if payload.get("version") != TOKENIZER_FORMAT[1]:
        raise ValueError(
            f"{path} is a tokenizer file of version {payload.get('version')!r}; this library reads version "
            f"{TOKENIZER_FORMAT[1]}"
        )
    try:
        tokenizer = tokenizer_from_dict(payload["tokenizer"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} holds a damaged tokenizer: {e}") from None
    if tokenizer_checksum(tokenizer) != payload.get("sha256"):
        raise ValueError(f"{path} fails its checksum: the file was changed or damaged after it was written")
    return tokenizer
