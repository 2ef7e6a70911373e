"""The small English-like language of chapter "A GPT from scratch", generated from a grammar.

A grammar is a tree: a ``str`` is itself, a ``list`` is its parts one after another, and a
:class:`Choice` is one of its options, drawn with the given probabilities. Because the tree is
known, three questions have exact answers: how many different strings it produces
(:func:`grammar_count`), a regular expression matching exactly those strings
(:func:`grammar_regex`), and the entropy and expected length of one string
(:func:`grammar_entropy`), whose ratio is the lowest loss any model can reach on the text.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence

__all__ = [
    "TOY_GRAMMAR",
    "Choice",
    "generate_from_grammar",
    "grammar_count",
    "grammar_entropy",
    "grammar_regex",
    "grammar_text",
]


class Choice:
    """One of several options (strings, lists of parts, or other Choices), drawn with ``probs`` (chapter "A GPT from
    scratch").

    Without ``probs`` the options are equally likely. Different options must produce different
    strings, or :func:`grammar_count` and :func:`grammar_entropy` over-count.
    """

    def __init__(self, options: Sequence, probs: Sequence[float] | None = None):
        self.options = list(options)
        if not self.options:
            raise ValueError("Choice needs at least one option, got none")
        if probs is None:
            probs = [1 / len(self.options)] * len(self.options)
        self.probs = [float(p) for p in probs]
        if len(self.probs) != len(self.options):
            raise ValueError(f"probs has {len(self.probs)} entries but there are {len(self.options)} options")
        if min(self.probs) < 0 or not math.isclose(sum(self.probs), 1.0, abs_tol=1e-9):
            raise ValueError(f"probs must be non-negative and sum to 1, got {self.probs}")

    def __repr__(self) -> str:
        return f"Choice({self.options!r}, {self.probs!r})"


def _kind(node) -> str:
    if isinstance(node, str):
        return "str"
    if isinstance(node, list):
        return "list"
    if isinstance(node, Choice):
        return "choice"
    raise TypeError(f"a grammar node is a str, a list or a Choice, got {type(node).__name__}: {node!r}")


def generate_from_grammar(node, rng: random.Random) -> str:
    """One random string from a grammar node, drawn with ``rng`` (chapter "A GPT from scratch")."""
    kind = _kind(node)
    if kind == "str":
        return node
    if kind == "list":
        return "".join(generate_from_grammar(part, rng) for part in node)
    return generate_from_grammar(rng.choices(node.options, weights=node.probs)[0], rng)


def grammar_count(node) -> int:
    """The number of different strings a grammar node can produce (chapter "A GPT from scratch")."""
    kind = _kind(node)
    if kind == "str":
        return 1
    if kind == "list":
        return math.prod(grammar_count(part) for part in node)
    return sum(grammar_count(option) for option in node.options)


def grammar_regex(node) -> str:
    """A regular expression that matches exactly the strings a grammar node produces (chapter "A GPT from scratch")."""
    kind = _kind(node)
    if kind == "str":
        return re.escape(node)
    if kind == "list":
        return "".join(grammar_regex(part) for part in node)
    return "(?:" + "|".join(grammar_regex(option) for option in node.options) + ")"


def grammar_entropy(node) -> tuple[float, float]:
    """``(entropy in nats, expected length in characters)`` of one string drawn from a node (chapter "A GPT from
    scratch").

    The entropy of a string is the sum of the entropies ``-sum p ln p`` of the choices made,
    each weighted by how often its Choice is reached (exact when different choices give
    different strings).
    """
    kind = _kind(node)
    if kind == "str":
        return 0.0, float(len(node))
    if kind == "list":
        parts = [grammar_entropy(part) for part in node]
        return sum(h for h, _ in parts), sum(n for _, n in parts)
    parts = [grammar_entropy(option) for option in node.options]
    entropy = sum((-p * math.log(p) if p > 0 else 0.0) + p * h for p, (h, _) in zip(node.probs, parts, strict=True))
    return entropy, sum(p * n for p, (_, n) in zip(node.probs, parts, strict=True))


def _toy_grammar() -> list:
    """The sentence of chapter "A GPT from scratch": subject and verb phrase agree in number ("one" or "many")."""
    adj = Choice(["", " small", " red", " quiet", " big", " lazy"], [0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
    noun = {
        "one": Choice([" cat", " dog", " bird", " fox", " child", " mouse", " king", " horse"]),
        "many": Choice([" cats", " dogs", " birds", " foxes", " children", " mice", " kings", " horses"]),
    }
    det = {"one": Choice(["the", "a", "every", "one"]), "many": Choice(["the", "some", "two", "all"])}
    object_det = {"one": Choice([" the", " a"]), "many": Choice([" the", " some", " two"])}
    intransitive = {
        "one": Choice([" sleeps", " runs", " sings", " waits"]),
        "many": Choice([" sleep", " run", " sing", " wait"]),
    }
    transitive = {
        "one": Choice([" sees", " chases", " likes", " follows"]),
        "many": Choice([" see", " chase", " like", " follow"]),
    }
    adverb = Choice(["", " quietly", " today", " again"], [0.4, 0.2, 0.2, 0.2])
    obj = Choice([[object_det[n], adj, noun[n]] for n in ("one", "many")])

    def clause(n):
        return [det[n], adj, noun[n], Choice([[intransitive[n], adverb], [transitive[n], obj]])]

    return [Choice([clause("one"), clause("many")]), ".\n"]


#: The grammar of chapter "A GPT from scratch": one sentence, ending with ".\n"; subject and verb agree in number.
TOY_GRAMMAR = _toy_grammar()


def grammar_text(n_sentences: int = 8000, seed: int = 0, grammar=None) -> str:
    """``n_sentences`` sentences of a grammar (default :data:`TOY_GRAMMAR`), drawn with
    ``random.Random(seed)``: the same text on every machine (chapter "A GPT from scratch")."""
    if isinstance(n_sentences, bool) or not isinstance(n_sentences, int) or n_sentences < 1:
        raise ValueError(f"n_sentences must be a positive int, got {n_sentences!r}")
    rng = random.Random(seed)
    grammar = TOY_GRAMMAR if grammar is None else grammar
    return "".join(generate_from_grammar(grammar, rng) for _ in range(n_sentences))
