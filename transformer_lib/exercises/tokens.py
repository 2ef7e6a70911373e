"""Checks for chapter "Tokens": one BPE merge, encoding a chunk by merge rank, and bits per
byte.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise

import regex

from .._checks import is_int, is_real
from ..bpe import PATTERNS, BPETokenizer, bpe_merge, train_bpe
from ._core import ExerciseFailure, call_student, check

__all__ = ["check_bits_per_byte", "check_encode_chunk", "check_merge"]

_TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
    "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n\n"
    "All:\nWe know't, we know't.\n\nFirst Citizen:\nLet us kill him, and we'll have corn at our own price.\n"
)


def _ids(value, where: str) -> list[int]:
    """``value`` as a list of ints, or a failure that says what it was."""
    if not isinstance(value, (list, tuple)) or not all(is_int(i) for i in value):
        raise ExerciseFailure(f"{where}, your function returned {value!r}; return a list of ints.")
    return list(value)


# ---------------------------------------------------------------- check_merge


def _merge_mistake(ids: list[int], pair: tuple[int, int], new_id: int, actual: list[int]) -> str | None:
    a, b = pair
    everywhere = [new_id if (x, y) == (a, b) else x for x, y in pairwise([*ids, None])]  # each pair, overlapping
    rightmost, i = [], len(ids) - 1
    while i >= 0:  # right to left
        if i > 0 and (ids[i - 1], ids[i]) == (a, b):
            rightmost.insert(0, new_id)
            i -= 2
        else:
            rightmost.insert(0, ids[i])
            i -= 1
    first = next((k for k in range(len(ids) - 1) if (ids[k], ids[k + 1]) == (a, b)), None)
    once = ids if first is None else [*ids[:first], new_id, *ids[first + 2 :]]
    wrong = {
        "you replaced the first occurrence only: every occurrence of the pair is merged": once,
        "you scanned from the right: merges go left to right, so in [5, 5, 5] the first two ids merge": rightmost,
        "you replaced the first id of every overlapping pair and kept its partner: after a merge, skip both ids "
        "of the pair": everywhere,
        "you merged (b, a), the pair reversed: the pair is (a, b), a first": bpe_merge(ids, (b, a), new_id),
    }
    found = [m for m, w in wrong.items() if w == actual and w != bpe_merge(ids, pair, new_id)]
    return found[0] if found else None


@check("check_merge")
def check_merge(fn: Callable) -> None:
    """Chapter "Tokens", exercise 1: check ``fn(ids, pair, new_id) -> list``, one BPE merge.

    ``fn`` is given a list of ints, a pair ``(a, b)`` and the new id, and returns a new list.
    Compared with :func:`transformer_lib.bpe_merge` on overlapping runs, pairs at both ends, a
    pair that never occurs, an empty and a one-id list; ``ids`` must be left unchanged.
    """
    cases = [
        ([1, 2, 3, 1, 2], (1, 2), 256),
        ([5, 5, 5], (5, 5), 300),
        ([5, 5, 5, 5], (5, 5), 300),
        ([7, 8, 7, 8, 8, 7], (8, 7), 260),
        ([1, 2, 3], (3, 1), 256),
        ([], (1, 2), 256),
        ([4], (4, 4), 256),
        ([9, 9, 1, 9, 9, 9], (9, 9), 999),
    ]
    for ids, pair, new_id in cases:
        where = f"for ids = {ids}, pair = {pair}, new_id = {new_id}"
        given = list(ids)
        out = _ids(call_student(fn, (given, pair, new_id), where, crash_hint=""), where)
        if given != ids:
            raise ExerciseFailure(f"{where}, your function changed ids in place; build a new list instead.")
        expected = bpe_merge(ids, pair, new_id)
        if out != expected:
            mistake = _merge_mistake(ids, pair, new_id, out)
            raise ExerciseFailure(f"{where}, {mistake + '; ' if mistake else ''}expected {expected}, got {out}.")


# ---------------------------------------------------------------- check_encode_chunk


def _leftmost(ids: list[int], ranks: dict) -> list[int]:
    """The mistake: merge the leftmost pair that is a merge, whatever its rank."""
    ids = list(ids)
    while True:
        pair = next((p for p in pairwise(ids) if p in ranks), None)
        if pair is None:
            return ids
        ids = bpe_merge(ids, pair, ranks[pair])


def _greedy(ids: list[int], tok: BPETokenizer) -> list[int]:
    """The mistake: the longest token that matches, left to right."""
    vocab = {b: i for i, b in enumerate(tok.token_bytes)}
    data, out, i = bytes(ids), [], 0
    while i < len(data):
        j = max(j for j in range(i + 1, len(data) + 1) if data[i:j] in vocab)
        out.append(vocab[data[i:j]])
        i = j
    return out


def _one_pass(ids: list[int], tok: BPETokenizer) -> list[int]:
    """The mistake: one merge of the best pair, then stop."""
    pairs = [p for p in pairwise(ids) if p in tok.ranks]
    if not pairs:
        return list(ids)
    pair = min(pairs, key=tok.ranks.get)
    return bpe_merge(ids, pair, tok.ranks[pair])


@check("check_encode_chunk")
def check_encode_chunk(fn: Callable) -> None:
    """Chapter "Tokens", exercise 2: check ``fn(ids, ranks) -> list``, a chunk encoded by merge rank.

    ``fn`` is given ``ids``, a chunk's bytes, and ``ranks``, which maps each merged pair to the id it made; compared
    with the book's encoder (a tokenizer trained on a passage of Shakespeare) on every chunk of
    the passage and on a few made-up words.
    """
    tok = train_bpe(_TEXT, 256 + 60)
    chunks = list(dict.fromkeys(regex.findall(PATTERNS["gpt2"], _TEXT))) + [
        " thee",
        "Citizens",
        " x",
        "e",
        "head",
        "when",
        " red",
    ]
    failures = []  # (where, expected, actual, the mistakes that give actual)
    for chunk in sorted(chunks, key=len):
        ids = list(chunk.encode("utf-8"))
        where = f"for the chunk {chunk!r} (bytes {ids})"
        ranks = dict(tok.ranks)
        out = _ids(call_student(fn, (list(ids), ranks), where, crash_hint=""), where)
        if ranks != tok.ranks:
            raise ExerciseFailure(f"{where}, your function changed ranks; leave it as it is.")
        expected = tok.encode_ordinary(chunk)
        if out != expected:
            wrong = {
                "you merged the leftmost pair that is a merge; merge the pair learned first (the smallest id "
                "in ranks)": _leftmost(ids, tok.ranks),
                "you took the longest token that matches, left to right; apply the merges in the order "
                "learned": _greedy(ids, tok),
                "you merged once and stopped; keep merging until no adjacent pair is in ranks": _one_pass(ids, tok),
            }
            failures.append((where, expected, out, [m for m, w in wrong.items() if w == out]))
    if failures:
        # a chunk where one mistake alone explains the answer names it; another may fit two
        where, expected, out, mistakes = next((f for f in failures if len(f[3]) == 1), failures[0])
        named = mistakes[0] + "; " if len(mistakes) == 1 else ""
        raise ExerciseFailure(f"{where}, {named}expected {expected}, got {out}.")


# ---------------------------------------------------------------- check_bits_per_byte


@check("check_bits_per_byte")
def check_bits_per_byte(fn: Callable) -> None:
    """Chapter "Tokens", exercise 3: check ``fn(nats_per_token, n_tokens, n_bytes) -> float``.

    ``fn`` is given the mean loss per token in nats and the text's tokens and bytes. Bits per byte
    is ``nats_per_token * n_tokens / (n_bytes * ln 2)``; compared on a character
    model's numbers (one byte per token) and on BPE models' (several bytes per token).
    """
    cases = [(2.0, 1000, 1000), (3.7, 1000, 1880), (3.96, 59_400, 111_539), (0.5, 3, 7)]
    for nats, n_tokens, n_bytes in cases:
        where = f"for nats_per_token = {nats}, n_tokens = {n_tokens}, n_bytes = {n_bytes}"
        out = call_student(fn, (nats, n_tokens, n_bytes), where, crash_hint="")
        if hasattr(out, "item") and getattr(out, "numel", lambda: 1)() == 1:
            out = out.item()
        if not is_real(out):
            raise ExerciseFailure(f"{where}, your function returned {out!r}; return a float.")
        expected = nats * n_tokens / (n_bytes * math.log(2))
        if not math.isclose(out, expected, rel_tol=1e-6):
            wrong = {
                "you left the loss in nats: divide by ln 2 to turn nats into bits": nats * n_tokens / n_bytes,
                "that is bits per token: divide the total by the bytes, not the tokens": nats / math.log(2),
                "you used log base 10 instead of the natural log ln 2": nats * n_tokens / (n_bytes * math.log10(2)),
                "you multiplied by the bytes per token; a token holds several bytes, so divide": nats
                * n_bytes
                / (n_tokens * math.log(2)),
            }
            mistake = next((m for m, w in wrong.items() if math.isclose(out, w, rel_tol=1e-6)), None)
            raise ExerciseFailure(
                f"{where}, {mistake + '; ' if mistake else ''}expected {expected:.6g}, got {out:.6g}."
            )
