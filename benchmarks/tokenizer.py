"""Byte-level BPE: the book's trainer against the naive reference and the Rust trainers, and its
encoder against tiktoken (chapter 13).

``naive_train_bpe`` is the reference: it recounts every pair of every chunk at every merge, which
is what the book's incremental trainer must agree with, merge for merge.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import regex

from transformer_lib.bpe import _pattern, bpe_merge


def naive_train_bpe(text: str, vocab_size: int, pattern: str = "gpt2") -> list[tuple[int, int]]:
    """The merges of ``vocab_size - 256`` steps, each step recounting every pair from scratch;
    ties go to the smaller pair, as in :func:`transformer_lib.train_bpe`."""
    chunks = Counter(regex.findall(_pattern(pattern), text))
    words = [(list(chunk.encode("utf-8")), f) for chunk, f in chunks.items()]
    merges: list[tuple[int, int]] = []
    while len(merges) < vocab_size - 256:
        counts: Counter[tuple[int, int]] = Counter()
        for word, f in words:
            for pair in pairwise(word):
                counts[pair] += f
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))  # the most frequent, then the smaller pair
        new_id = 256 + len(merges)
        merges.append(pair)
        words = [(bpe_merge(word, pair, new_id), f) for word, f in words]
    return merges
