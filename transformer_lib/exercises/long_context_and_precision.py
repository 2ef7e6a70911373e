"""Checks for chapter "Long context and precision": the online-softmax merge of two
blocks of keys.

- :func:`check_softmax_merge` for ``fn(m1, l1, o1, m2, l2, o2) -> (m, l, o)`` (exercise ex-11-1).

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._core import ExerciseFailure, call_student, check, close, fmt, require_finite, require_tensor, require_tensors

__all__ = ["check_softmax_merge", "reference_softmax_merge", "softmax_block_stats"]


# ---------------------------------------------------------------- check_softmax_merge


def softmax_block_stats(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One block's online-softmax statistics (chapter "Long context and precision", exercise 1).

    ``scores (..., n)`` and ``values (n, d)`` give ``m (..., 1)``, the largest score, ``l (..., 1)``
    the sum of ``exp(score - m)``, and ``o (..., d)``, the block's own softmax average of the
    values. A block whose scores are all ``-inf`` has ``m = -inf``, ``l = 0`` and ``o = 0``.
    """
    m = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - torch.where(torch.isinf(m), torch.zeros_like(m), m))  # (..., n)
    l = p.sum(-1, keepdim=True)  # noqa: E741 (the name of the running sum in the chapter)
    o = (p @ values) / torch.where(l > 0, l, torch.ones_like(l))
    return m, l, o


def reference_softmax_merge(
    m1: Tensor, l1: Tensor, o1: Tensor, m2: Tensor, l2: Tensor, o2: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The statistics ``(m, l, o)`` of two blocks of keys together, from each block's (chapter "Long context and
    precision").

    ``m, l (..., 1)`` and ``o (..., d)`` as :func:`softmax_block_stats` returns them. The sums are
    rescaled to the common maximum: ``l = l1 exp(m1 - m) + l2 exp(m2 - m)``, and ``o`` is the
    average of ``o1`` and ``o2`` weighted by the two rescaled sums.
    """
    m = torch.maximum(m1, m2)
    a1, a2 = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)  # (..., 1) each block's mass
    l = a1 + a2  # noqa: E741
    return m, l, (a1 * o1 + a2 * o2) / l


def _merge_cases() -> list[tuple[str, Tensor, Tensor, Tensor, int]]:
    """(description, scores (R, n), values (n, d), a mask or None, split point) of two blocks."""
    g = torch.Generator().manual_seed(12)
    cases = [
        (
            "one query, scores [1.0, 0.5 | 3.0, 2.0] (the second block has the larger maximum)",
            torch.tensor([[1.0, 0.5, 3.0, 2.0]]),
            torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]]),
            2,
        ),
        (
            "one query, scores [4.0, 1.0 | 0.0, -2.0] (the first block has the larger maximum)",
            torch.tensor([[4.0, 1.0, 0.0, -2.0]]),
            torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]]),
            2,
        ),
        ("3 queries, 5 + 3 random keys, d = 4", torch.randn(3, 8, generator=g), torch.randn(8, 4, generator=g), 5),
        (
            "2 queries, blocks of 1 and 6 keys, float64",
            torch.randn(2, 7, generator=g, dtype=torch.float64),
            torch.randn(7, 3, generator=g, dtype=torch.float64),
            1,
        ),
        (
            "2 queries with scores near 1000 (exp(1000) overflows)",
            1000 + torch.randn(2, 6, generator=g),
            torch.randn(6, 3, generator=g),
            3,
        ),
        (
            "2 queries whose second block is fully masked (scores -inf: m2 = -inf, l2 = 0, o2 = 0)",
            torch.cat([torch.randn(2, 3, generator=g), torch.full((2, 2), float("-inf"))], -1),
            torch.randn(5, 3, generator=g),
            3,
        ),
    ]
    return cases


def _merge_hint(stats: tuple[Tensor, ...], got: tuple[Tensor, Tensor, Tensor], want: tuple[Tensor, ...]) -> str:
    """Name the likely slip behind a wrong merge."""
    m1, l1, o1, m2, l2, o2 = stats
    m, l, o = got
    if not close(m, want[0]):
        return f"m should be the larger of the two maxima, max(m1, m2). Expected {fmt(want[0])}, got {fmt(m)}"
    if close(l, l1 + l2) and not close(l, want[1]):
        return (
            "you added l1 and l2 as they are, but they are sums of exp(score - m1) and exp(score - m2), under "
            "different maxima: rescale each to the new maximum first, l = l1 exp(m1 - m) + l2 exp(m2 - m)"
        )
    if not close(l, want[1]):
        return f"l should be l1 exp(m1 - m) + l2 exp(m2 - m). Expected {fmt(want[1])}, got {fmt(l)}"
    if close(o, (o1 + o2) / 2):
        return (
            "you averaged o1 and o2 with equal weights; weight each block's output by its share of the "
            "total mass, l1 exp(m1 - m) / l and l2 exp(m2 - m) / l"
        )
    a1, a2 = l1 * torch.exp(m1 - want[0]), l2 * torch.exp(m2 - want[0])
    if close(o, a1 * o1 + a2 * o2):
        return "you did not divide by the new sum l: o is an average, (a1 o1 + a2 o2) / l"
    if close(o, (l1 * o1 + l2 * o2) / (l1 + l2)):
        return "you weighted o1 and o2 by l1 and l2 without rescaling them to the common maximum m"
    return "o should be (l1 exp(m1 - m) o1 + l2 exp(m2 - m) o2) / l"


@check("check_softmax_merge")
def check_softmax_merge(fn: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    """Chapter "Long context and precision", exercise 1: check ``fn(m1, l1, o1, m2, l2, o2) -> (m, l, o)``, two blocks
    merged.

    ``fn`` is given each block's ``m, l (R, 1)`` and ``o (R, d)`` as :func:`softmax_block_stats`
    computes them (float32 and float64; scores near 1000; a fully masked block with ``m = -inf``)
    and must return the statistics of both blocks together. The merged ``o`` must equal softmax
    attention over all the keys.
    """
    for desc, scores, values, split in _merge_cases():
        where = f"for {desc}"
        stats = (
            *softmax_block_stats(scores[:, :split], values[:split]),
            *softmax_block_stats(scores[:, split:], values[split:]),
        )
        got = require_tensors(
            call_student(fn, stats, where, inputs="the statistics it was given"), where, ("m", "l", "o")
        )
        want = reference_softmax_merge(*stats)
        for name, value, w in zip(("m", "l", "o"), got, want, strict=True):
            require_tensor(value, where, w.shape, w.dtype, what=name, layout="(R, 1)" if name != "o" else "(R, d)")
        for name, value in zip(("l", "o"), got[1:], strict=True):
            require_finite(
                value,
                where,
                what=name,
                hint=": exp of a large score overflows, so work only with differences such as m1 - m, which are "
                "never positive (and exp(-inf) = 0 for a fully masked block)",
            )
        tol = 1e-5 if scores.dtype == torch.float32 else 1e-10
        if not all(close(v.detach(), w, atol=tol, rtol=tol) for v, w in zip(got, want, strict=True)):
            raise ExerciseFailure(f"{where}: {_merge_hint(stats, tuple(v.detach() for v in got), want)}.")
        full = torch.softmax(scores.double(), -1) @ values.double()  # (R, d)
        if not close(got[2].detach(), full, atol=10 * tol, rtol=10 * tol):
            raise ExerciseFailure(f"{where}, o differs from softmax attention over all the keys: {fmt(full)}.")
    _check_many_blocks(fn)


def _check_many_blocks(fn: Callable) -> None:
    """Fold ten blocks of three keys, left to right, with ``fn``: the result is softmax attention."""
    g = torch.Generator().manual_seed(13)
    scores, values = 3 * torch.randn(2, 30, generator=g, dtype=torch.float64), torch.randn(30, 2, generator=g)
    values = values.double()
    m, l, o = softmax_block_stats(scores[:, :3], values[:3])  # noqa: E741
    where = "folding 10 blocks of 3 keys, one after another"
    for start in range(3, 30, 3):
        block = softmax_block_stats(scores[:, start : start + 3], values[start : start + 3])
        m, l, o = require_tensors(call_student(fn, (m, l, o, *block), where), where, ("m", "l", "o"))  # noqa: E741
    full = torch.softmax(scores, -1) @ values
    if not close(o.detach(), full, atol=1e-10):
        raise ExerciseFailure(f"{where}, the result is not softmax attention over all 30 keys: {fmt(full)}.")
    if not math.isclose(float(l.detach()[0, 0]), float(torch.exp(scores[0] - scores[0].max()).sum()), rel_tol=1e-9):
        raise ExerciseFailure(f"{where}, l is not the sum of exp(score - m) over all 30 keys.")
