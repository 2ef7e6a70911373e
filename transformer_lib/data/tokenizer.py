"""A character tokenizer and padding (chapter 8, "Encoder-decoder and cross-attention")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .._checks import is_int

__all__ = ["SPECIALS", "CharTokenizer", "pad_sequences"]

SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2 when given first to CharTokenizer


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
    """Lists of ids -> a ``(N, length)`` LongTensor padded on the right (default: the longest; chapter 8)."""
    length = max((len(s) for s in seqs), default=0) if length is None else length
    out = np.full((len(seqs), length), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has length {len(s)} > {length}")
        out[i, : len(s)] = s
    return torch.from_numpy(out)
