"""Tests for chapter "A GPT from scratch"'s toy grammar (transformer_lib/data/grammar.py) and chapter "Encoder-decoder
and cross-attention"'s alignment statistics."""

import itertools
import math
import random
import re

import pytest

import transformer_lib as tl
from transformer_lib.data import (
    TOY_GRAMMAR,
    Choice,
    generate_from_grammar,
    grammar_count,
    grammar_entropy,
    grammar_regex,
    grammar_text,
)


def all_strings(node):
    """Every (string, probability) a node produces, by brute force."""
    if isinstance(node, str):
        return [(node, 1.0)]
    if isinstance(node, list):
        out = [("", 1.0)]
        for part in node:
            out = [(a + b, p * q) for (a, p), (b, q) in itertools.product(out, all_strings(part))]
        return out
    return [(s, p * q) for option, p in zip(node.options, node.probs, strict=True) for s, q in all_strings(option)]


SMALL = [
    Choice(["a", "b"], [0.25, 0.75]),
    ["x", Choice(["", "y", "zz"], [0.5, 0.3, 0.2]), "."],
    [Choice([["p", Choice(["q", "r"])], "s"], [0.6, 0.4]), Choice(["!", "?"])],
]


@pytest.mark.parametrize("grammar", SMALL)
def test_count_regex_and_entropy_agree_with_brute_force(grammar):
    strings = all_strings(grammar)
    distinct = {s for s, _ in strings}
    assert len(distinct) == len(strings) == grammar_count(grammar)
    regex = re.compile(grammar_regex(grammar))
    assert all(regex.fullmatch(s) for s in distinct)
    for s in distinct:  # one character more or less is not a sentence
        assert not regex.fullmatch(s + "#")
    entropy, length = grammar_entropy(grammar)
    assert entropy == pytest.approx(-sum(p * math.log(p) for _, p in strings))
    assert length == pytest.approx(sum(p * len(s) for s, p in strings))


@pytest.mark.parametrize("grammar", SMALL)
def test_generated_strings_follow_the_probabilities(grammar):
    rng = random.Random(1)
    n = 20_000
    counts = {}
    for _ in range(n):
        s = generate_from_grammar(grammar, rng)
        counts[s] = counts.get(s, 0) + 1
    for s, p in all_strings(grammar):
        assert abs(counts.get(s, 0) / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9


def test_the_chapter_9_language():
    text = grammar_text(500, seed=3)
    lines = text.splitlines(keepends=True)
    assert len(lines) == 500 and text == grammar_text(500, seed=3) != grammar_text(500, seed=4)
    is_sentence = re.compile(grammar_regex(TOY_GRAMMAR)).fullmatch
    assert all(map(is_sentence, lines))
    # subject and verb agree: a singular subject never meets a plural verb
    assert not is_sentence("every cat sleep.\n") and not is_sentence("all cats sleeps.\n")
    assert is_sentence("every cat sleeps.\n") and is_sentence("all cats sleep quietly.\n")
    assert grammar_count(TOY_GRAMMAR) == 374_784
    entropy, length = grammar_entropy(TOY_GRAMMAR)
    # the entropy rate (nats per character) lies below ln of the 28 characters
    assert 0 < entropy / length < math.log(len(set(text)))
    assert tl.grammar_text is grammar_text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Choice([]), "at least one option"),
        (lambda: Choice(["a", "b"], [1.0]), "probs has 1 entries but there are 2 options"),
        (lambda: Choice(["a", "b"], [0.7, 0.7]), "sum to 1"),
        (lambda: Choice(["a", "b"], [1.5, -0.5]), "non-negative"),
        (lambda: grammar_count(["a", 3]), "a str, a list or a Choice, got int"),
        (lambda: grammar_text(0), "n_sentences must be a positive int, got 0"),
        (lambda: grammar_text(True), "n_sentences must be a positive int, got True"),
    ],
)
def test_bad_grammars_and_arguments_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


# --------------------------------------------------------------------------------------------
# date_field_shares (chapter "Encoder-decoder and cross-attention"'s alignment statistics; in
# transformer_lib/data/tasks.py)
# --------------------------------------------------------------------------------------------


def _dates_and_sources(n=6, seed=0):
    import datetime

    rng = random.Random(seed)
    dates = [tl.DATE_FIRST + datetime.timedelta(days=rng.randrange(30000)) for _ in range(n)]
    formats = [rng.choice(list(tl.DATE_FORMATS)) for _ in range(n)]
    texts = [tl.render_date(d, f) for d, f in zip(dates, formats, strict=True)]
    return dates, formats, texts


def _weights(texts, layers, heads, fill):
    import torch

    T_src = max(map(len, texts))
    w = torch.zeros(len(texts), layers, heads, len(tl.ISO_FIELDS), T_src, dtype=torch.float64)
    for n, text in enumerate(texts):
        fill(w[n], n, text)
    return w


def test_date_field_shares_is_one_for_perfect_alignment_and_uniform_for_even_weights():
    dates, formats, texts = _dates_and_sources()

    def perfect(w, n, text):
        _, spans = tl.date_field_spans(dates[n], formats[n])
        for t, field in enumerate(tl.ISO_FIELDS):
            cols = list(spans[field]) if field else [0]
            w[..., t, cols] = 1.0 / len(cols)

    def even(w, n, text):
        w[..., : len(text)] = 1.0 / len(text)

    good = tl.date_field_shares(_weights(texts, 2, 3, perfect), texts, formats, dates)
    assert good["share"].shape == (6, 2, 3, 8) and good["per_field"].shape == (3, 2, 3)
    assert torch_allclose(good["per_head"], 1.0) and torch_allclose(good["per_field"], 1.0)
    flat = tl.date_field_shares(_weights(texts, 1, 2, even), texts, formats, dates)
    # even weights score exactly the uniform reference, whatever the formats, field by field too
    assert flat["per_head"].mean().item() == pytest.approx(flat["uniform"])
    assert 0 < flat["uniform"] < 1
    assert flat["uniform_per_field"].shape == (3,)
    assert torch_allclose(flat["per_field"] - flat["uniform_per_field"][:, None, None], 0.0)
    # the overall reference weighs the fields by their digits: 4 of the year, 2 of the month and day
    by_digits = (4 * flat["uniform_per_field"][0] + 2 * flat["uniform_per_field"][1:].sum()) / 8
    assert flat["uniform"] == pytest.approx(by_digits.item())
    # each field's reference is its mean share of the source's characters
    for k, field in enumerate(("year", "month", "day")):
        spans = [tl.date_field_spans(d, f)[1][field] for d, f in zip(dates, formats, strict=True)]
        expected = sum(len(r) / len(t) for r, t in zip(spans, texts, strict=True)) / len(texts)
        assert flat["uniform_per_field"][k].item() == pytest.approx(expected)


def torch_allclose(x, value):
    return bool((x - value).abs().max() < 1e-12)


def test_date_field_shares_names_bad_input():
    import torch

    dates, formats, texts = _dates_and_sources(3)
    w = torch.zeros(3, 1, 1, 11, 40)
    with pytest.raises(ValueError, match="cross must have shape"):
        tl.date_field_shares(w[0], texts, formats, dates)
    with pytest.raises(ValueError, match="one entry per row of cross \\(3\\), got 2, 3 and 3"):
        tl.date_field_shares(w, texts[:2], formats, dates)
    with pytest.raises(ValueError, match="output rows"):
        tl.date_field_shares(w[:, :, :, :5], texts, formats, dates)
    with pytest.raises(ValueError, match=r"texts\[0\] = 'nonsense' is not"):
        tl.date_field_shares(w, ["nonsense"] + texts[1:], formats, dates)
