"""Checks for chapter "Why attention?": how many convolution layers connect two positions.

The chapter's coding exercise asks for ``layers_to_connect(n, k, dilated=False)``: the smallest
number of stacked causal 1-D convolutions with kernel width ``k`` after which the last of ``n``
positions depends on the first. :func:`layers_to_connect` is the reference answer and
:func:`check_layers_to_connect` grades a student's version.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..cost import layers_to_connect, receptive_field
from ._core import ExerciseFailure, check, require_int

__all__ = ["check_layers_to_connect"]


def _cases() -> list[tuple[int, int, bool]]:
    """Inputs in the order they are tried: smallest first, exact powers of k included."""
    cases = set()
    for k in (2, 3, 4, 5, 6, 7):
        for n in list(range(1, 20)) + [k**2, k**3, k**3 + 1, k**4 - 1, k**4, 100, 1000, 1024]:
            for dilated in (False, True):
                cases.add((n, k, dilated))
    return sorted(cases, key=lambda c: (c[0], c[1], c[2]))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _hint(n: int, k: int, dilated: bool, actual: int, expected: int) -> str:
    """A sentence naming the likely mistake behind a wrong count."""
    log_k = layers_to_connect(n, k, dilated=True)
    contiguous = layers_to_connect(n, k, dilated=False)
    if not dilated and actual == log_k:
        return (
            "that is the logarithmic count of a *dilated* stack. With contiguous kernels each layer "
            "widens the receptive field by only k - 1 positions, so the count grows linearly with n, "
            "about (n - 1) / (k - 1)."
        )
    if dilated and actual == contiguous:
        return (
            "that is the count for contiguous kernels: the dilation was ignored. With dilation k**l at "
            "layer l the receptive field is k**L after L layers, so you need the smallest L with k**L >= n."
        )
    if dilated and k != 2 and actual == layers_to_connect(n, 2, dilated=True) and actual != expected:
        return (
            f"that is log base 2 of n. The dilation grows by a factor k = {k} per layer, so the receptive "
            "field is k**L and the count is the base-k logarithm: the smallest L with k**L >= n."
        )
    if dilated and n >= k * k and n == k ** round(math.log(n, k)) and actual == expected + 1:
        return (
            f"n = {n} is an exact power of k = {k}: k**{expected} = {n} positions are already enough. A "
            "floating-point log can come out a hair above the whole number (and ceil then rounds it up); "
            "count with integers instead, for example by multiplying the receptive field by k until it reaches n."
        )
    if not dilated and k > 2 and actual == n - 1:
        return (
            "that is one layer per step back, as in a recurrent network; a contiguous layer of width k "
            "reaches k - 1 positions further back, so about (n - 1) / (k - 1) layers are enough."
        )
    if abs(actual - expected) == 1:
        formula = "k**L" if dilated else "1 + L * (k - 1)"
        if n == 1:
            return (
                f"off by one. With n = 1 the first and the last position are the same token, so 0 layers are "
                f"needed. In general the last output sees {formula} positions after L layers: count positions, "
                "not gaps, and round up."
            )
        field = receptive_field(expected, k, dilated)
        return (
            f"off by one. After {_plural(expected, 'layer')} the last output sees "
            f"{_plural(field, 'input position')} ({formula} with L = {expected}), enough to reach position 0, "
            f"{_plural(n - 1, 'step')} back; count positions, not gaps, and round up."
        )
    if not dilated and actual > expected:
        return "too many layers: a contiguous layer of width k reaches k - 1 positions further back, not 1."
    return (
        "the count should grow linearly with n for contiguous kernels (about (n - 1) / (k - 1)) and "
        "logarithmically for dilated ones (the smallest L with k**L >= n)."
    )


@check("check_layers_to_connect")
def check_layers_to_connect(fn: Callable[..., int]) -> None:
    """Chapter "Why attention?", exercise 2: grade ``fn(n, k, dilated=False) -> int`` against :func:`layers_to_connect`.

    ``fn`` is given plain ints (no tensors): n from 1 up, k from 2 to 7, contiguous and dilated,
    exact powers of k. Reports the smallest failing input with the expected and returned counts
    and a hint about the mistake.
    """
    for n, k, dilated in _cases():
        expected = layers_to_connect(n, k, dilated=dilated)
        call = f"layers_to_connect({n}, {k}, dilated={dilated})"
        actual = require_int(fn(n, k, dilated=dilated), call, " (round up with math.ceil or integer arithmetic)")
        if actual != expected:
            raise ExerciseFailure(
                f"{call} returned {actual}, expected {expected}: {_hint(n, k, dilated, actual, expected)}"
            )
