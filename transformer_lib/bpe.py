"""Byte-level byte-pair encoding (chapter "Tokens").

Text becomes UTF-8 bytes, ids ``0 .. 255``; training merges the most frequent adjacent pair of ids
into a new id, ``256, 257, ...``, one merge at a time. Before counting, the text is split into
chunks by a pattern (GPT-2's or GPT-4's, by name), so no merge crosses a space, a digit run or a
punctuation boundary. Encoding applies the merges in the order they were learned, chunk by chunk;
decoding concatenates the bytes of the ids.

The ideas are Sennrich et al.'s BPE for subwords and GPT-2's byte-level variant; the code is the
book's own. The special tokens (``<|endoftext|>`` and the like) take the ids after the merges and
are never made from text unless the caller allows it (:meth:`BPETokenizer.encode`).

**Ties.** When two pairs are equally frequent, training takes the smaller pair, comparing first
ids first: ``(32, 116)`` before ``(32, 119)`` before ``(101, 32)``. The rule uses only integers,
so training gives the same merges on every machine.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from itertools import pairwise

import regex
from torch import Tensor

from ._checks import check_int, is_int

__all__ = ["PATTERNS", "BPETokenizer", "bpe_merge", "bytes_per_token", "train_bpe"]

#: The pre-split patterns of GPT-2 and of GPT-4 (cl100k_base), by name (chapter "Tokens"), which
#: tiktoken and Hugging Face's tokenizers also use; ``\p{L}`` is any letter, ``\p{N}`` any digit.
PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "gpt4": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s+""",
}
_CACHE_LIMIT = 200_000  # encoded chunks kept; the cache is emptied when it grows past this


def _pattern(pattern: str) -> str:
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a name ({', '.join(PATTERNS)}) or a regex string, got {pattern!r}")
    if pattern not in PATTERNS and regex.fullmatch(r"[A-Za-z0-9_]+", pattern):
        raise ValueError(f"unknown pattern name {pattern!r}: the names are {', '.join(map(repr, PATTERNS))}")
    text = PATTERNS.get(pattern, pattern)
    try:
        regex.compile(text)
    except regex.error as e:
        raise ValueError(
            f"pattern {pattern!r} is neither a known name ({', '.join(PATTERNS)}) nor a regex: {e}"
        ) from None
    if regex.fullmatch(text, ""):
        raise ValueError(f"pattern {pattern!r} matches the empty string: its chunks would not hold the text")
    return text


def _covered(chunks: list, text: str, pattern: str) -> list:
    """``chunks``, the pre-split of ``text``, if together they are the whole text; a pattern that
    leaves characters out of every chunk would lose them, and is refused by name."""
    if sum(len(c) if isinstance(c, str) else -1 for c in chunks) != len(text):
        i = 0
        for c in chunks:
            if not isinstance(c, str) or not text.startswith(c, i):
                break
            i += len(c)
        raise ValueError(
            f"pattern {pattern!r} loses text: {text[i : i + 1]!r} at index {i} is in no chunk, so decoding the ids "
            f"would not give the text back; a pre-split pattern must match every character (try 'gpt2')"
        )
    return chunks


def _specials(specials) -> tuple[str, ...]:
    if isinstance(specials, (str, bytes)):
        raise TypeError(
            f"specials must be a list of strings, got the {type(specials).__name__} {specials!r}: write [{specials!r}]"
        )
    return tuple(specials)


def _utf8(text: str, name: str = "text") -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{name} holds {text[e.start]!r} at index {e.start}, a lone surrogate that UTF-8 cannot encode; "
            f"clean it first, for example text.encode('utf-8', 'replace').decode()"
        ) from None


def bpe_merge(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ids`` with every occurrence of ``pair`` replaced by ``new_id``, left to right (chapter "Tokens"):
    ``bpe_merge([5, 5, 5], (5, 5), 9) == [9, 5]``."""
    out, i, a, b = [], 0, pair[0], pair[1]
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def train_bpe(text: str, vocab_size: int, pattern: str = "gpt2", specials: Sequence[str] = ()) -> BPETokenizer:
    """Learn ``vocab_size - 256 - len(specials)`` merges from ``text`` (chapter "Tokens").

    The text is split by ``pattern`` into chunks, which together must be the whole text (a pattern
    that leaves a character out, or matches the empty string, is refused: the ids would not decode
    to the text). Each distinct chunk is counted once with its frequency; ``specials`` is a list of
    strings. Pair counts are kept up to date where a merge changes them, never recounted, and a
    heap gives the most frequent pair (ties: the smaller pair, see the module's docstring). Training
    stops early, with a smaller vocabulary, if no pair is left to merge.
    """
    specials = _specials(specials)
    check_int(vocab_size, "vocab_size", minimum=256 + len(specials))
    _utf8(text)  # checks the type and rejects lone surrogates
    BPETokenizer([], pattern, specials)  # checks the pattern and the specials before the work
    chunks = Counter(_covered(regex.findall(_pattern(pattern), text), text, pattern))
    words = [list(chunk.encode("utf-8")) for chunk in chunks]
    freqs = list(chunks.values())
    counts: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> the words that hold it
    for w, (word, f) in enumerate(zip(words, freqs, strict=True)):
        for pair in pairwise(word):
            counts[pair] += f
            where[pair].add(w)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < vocab_size - 256 - len(specials) and heap:
        negative, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -negative or negative == 0:
            continue  # a stale entry: the pair's count changed after it was pushed
        new_id = 256 + len(merges)
        merges.append(pair)
        delta: defaultdict[tuple[int, int], int] = defaultdict(int)
        for w in where.pop(pair):
            word, f = words[w], freqs[w]
            merged = bpe_merge(word, pair, new_id)
            for old in pairwise(word):
                delta[old] -= f
            for new in pairwise(merged):
                delta[new] += f
                where[new].add(w)
            words[w] = merged
        for changed, d in delta.items():
            if d:
                counts[changed] += d
                if counts[changed] > 0:
                    heapq.heappush(heap, (-counts[changed], changed))
                else:
                    del counts[changed]
    return BPETokenizer(merges, pattern, specials)


def bytes_per_token(tokenizer, text: str) -> float:
    """UTF-8 bytes of ``text`` per token of ``tokenizer`` (chapter "Tokens"): how much text a token holds."""
    n = len(tokenizer.encode(text))
    if n == 0:
        raise ValueError("text is empty: bytes per token is undefined")
    return len(_utf8(text)) / n


class BPETokenizer:
    """A byte-level BPE tokenizer (chapter "Tokens"): ``merges`` in the order learned, merge ``i`` making
    id ``256 + i``; the ``specials`` take the ids after them. :func:`train_bpe` makes one.

    It shares the interface of :class:`~transformer_lib.data.CharTokenizer`: ``encode``,
    ``decode``, ``vocab_size``, ``to_dict`` and ``from_dict``, ``specials``, ``eos_id``.
    """

    kind = "bpe"

    def __init__(self, merges: Iterable[tuple[int, int]], pattern: str = "gpt2", specials: Sequence[str] = ()):
        self.pattern_name, self.pattern = pattern, _pattern(pattern)
        self._split = regex.compile(self.pattern)
        self.merges = [tuple(m) for m in merges]
        self.specials = _specials(specials)
        self.token_bytes = [bytes([b]) for b in range(256)]
        self.ranks: dict[tuple[int, int], int] = {}
        for i, pair in enumerate(self.merges):
            if len(pair) != 2 or not all(is_int(t) and 0 <= t < 256 + i for t in pair):
                raise ValueError(f"merge {i} is {pair!r}: a merge is two ids made before it (below {256 + i})")
            if pair in self.ranks:
                raise ValueError(f"merge {i} repeats the pair {pair} of merge {self.ranks[pair] - 256}")
            self.ranks[pair] = 256 + i
            self.token_bytes.append(self.token_bytes[pair[0]] + self.token_bytes[pair[1]])
        if any(not isinstance(s, str) or not s for s in self.specials) or len(set(self.specials)) < len(self.specials):
            raise ValueError(f"specials must be distinct non-empty strings, got {list(self.specials)}")
        self.special_ids = {s: 256 + len(self.merges) + i for i, s in enumerate(self.specials)}
        self._special_split = (
            regex.compile("(" + "|".join(regex.escape(s) for s in sorted(self.specials, key=len, reverse=True)) + ")")
            if self.specials
            else None
        )
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges) + len(self.specials)

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("<|endoftext|>", self.special_ids.get("<eos>"))

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("<bos>")

    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("<pad>")

    def _encode_chunk(self, chunk: str) -> list[int]:
        cached = self._cache.get(chunk)
        if cached is not None:
            return cached
        ids, ranks = list(chunk.encode("utf-8")), self.ranks
        while len(ids) > 1:
            pair = min(pairwise(ids), key=lambda p: ranks.get(p, 1 << 62))  # the earliest learned merge
            if pair not in ranks:
                break
            ids = bpe_merge(ids, pair, ranks[pair])
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[chunk] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """``text`` -> ids, reading every character as text, special-token spellings included."""
        _utf8(text)
        ids: list[int] = []
        for chunk in _covered(self._split.findall(text), text, self.pattern_name):
            ids.extend(self._encode_chunk(chunk))
        return ids

    def encode(
        self, text: str, *, allowed_special: Collection[str] | str = (), bos: bool = False, eos: bool = False
    ) -> list[int]:
        """``text`` -> ids (chapter "Tokens"). Text that spells a special token raises ``ValueError``
        unless that token is in ``allowed_special`` (or it is ``"all"``), so a user's text cannot
        inject one; :meth:`encode_ordinary` reads such text as text. ``bos``/``eos`` add the
        ``<bos>``/end token around the ids, as :class:`~transformer_lib.data.CharTokenizer` does."""
        _utf8(text)
        allowed = set(self.specials) if allowed_special == "all" else set(allowed_special)
        if unknown := allowed - set(self.specials):
            raise ValueError(f"allowed_special names {sorted(unknown)}, not special tokens of this tokenizer")
        ids: list[int] = []
        pieces = self._special_split.split(text) if self._special_split else [text]
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                ids.extend(self.encode_ordinary(piece))
            elif piece in allowed:
                ids.append(self.special_ids[piece])
            else:
                raise ValueError(
                    f"the text spells the special token {piece!r}: pass allowed_special={{{piece!r}}} to make it "
                    f"the token, or use encode_ordinary to read it as text"
                )
        for flag, tid, name in ((bos, self.bos_id, "<bos>"), (eos, self.eos_id, "end-of-text")):
            if flag and tid is None:
                raise ValueError(f"this tokenizer has no {name} token")
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode_bytes(self, ids: Iterable[int] | Tensor) -> bytes:
        """The bytes of ``ids`` concatenated (special tokens as their UTF-8 spelling)."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode takes one sequence of ids (T,), got a tensor of shape {tuple(ids.shape)}")
            ids = ids.tolist()
        out, n, V = [], len(self.token_bytes), self.vocab_size
        for i in ids:
            if not is_int(i):
                raise TypeError(f"token ids must be ints, got {i!r} ({type(i).__name__})")
            if not 0 <= i < V:
                raise ValueError(f"token id {i} is outside the vocabulary [0, vocab_size={V})")
            out.append(self.token_bytes[i] if i < n else self.specials[i - n].encode("utf-8"))
        return b"".join(out)

    def decode(self, ids: Iterable[int] | Tensor, skip_specials: bool = True) -> str:
        """ids -> text: the bytes concatenated, then read as UTF-8 (chapter "Tokens"). A cut through a
        character (ids that end mid-character) reads as U+FFFD; special tokens are dropped
        (``skip_specials``) or written out."""
        if skip_specials:
            ids = [
                i
                for i in (ids.tolist() if isinstance(ids, Tensor) and ids.dim() == 1 else ids)
                if not (is_int(i) and len(self.token_bytes) <= i < self.vocab_size)
            ]
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def mergeable_ranks(self) -> dict[bytes, int]:
        """Every token's bytes -> its id, the ``mergeable_ranks`` that ``tiktoken.Encoding`` takes."""
        return {b: i for i, b in enumerate(self.token_bytes)}

    def to_dict(self) -> dict:
        """A plain dict (saved in checkpoints and tokenizer files); :meth:`from_dict` rebuilds it."""
        return {
            "kind": self.kind,
            "pattern": self.pattern_name,
            "merges": [list(m) for m in self.merges],
            "specials": list(self.specials),
        }

    @classmethod
    def from_dict(cls, d: dict) -> BPETokenizer:
        return cls([tuple(m) for m in d["merges"]], d["pattern"], d.get("specials", ()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and self.to_dict() == other.to_dict() and self.pattern == other.pattern

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, pattern={self.pattern_name!r}, "
            f"specials={list(self.specials)})"
        )
