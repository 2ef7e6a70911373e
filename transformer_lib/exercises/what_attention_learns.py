"""Checks for chapter "What attention learns": the previous-token score and the
prefix-matching (induction) score of attention patterns.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..inspect_heads import induction_score, previous_token_score
from ._core import ExerciseFailure, call_student, check, close, fmt, require_tensor

__all__ = ["check_induction_score", "check_previous_token_score"]


def _causal_pattern(shape: tuple[int, ...], seed: int, dtype=torch.float32) -> Tensor:
    """Random causal attention weights ``(..., T, T)``: rows sum to 1, zeros above the diagonal."""
    g = torch.Generator().manual_seed(seed)
    T = shape[-1]
    scores = torch.randn(shape, generator=g, dtype=torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1).to(dtype)


def _shifted(T: int, offset: int) -> Tensor:
    """A ``(T, T)`` pattern in which query ``t`` attends fully to key ``max(t - offset, 0)``."""
    keys = (torch.arange(T) - offset).clamp_min(0)
    return torch.nn.functional.one_hot(keys, T).float()


def _unique(wrong: dict[str, Tensor], actual: Tensor, right: Tensor) -> str | None:
    """The one message whose wrong value ``actual`` equals (and the right value does not), else None."""
    found = [m for m, value in wrong.items() if close(actual, value) and not close(value, right)]
    return found[0] if len(found) == 1 else None


def _judge(cases: list[tuple[str, Tensor, Tensor, str | None]]) -> None:
    """Raise for the first case whose mistake is recognised, else for the first wrong case.

    ``cases``: ``(where, expected, actual, mistake or None)`` of every wrong case, in order; a
    hand-built input can leave two slips equally wrong, a random one tells them apart.
    """
    if not cases:
        return
    where, expected, actual, mistake = next((c for c in cases if c[3]), cases[0])
    detail = f"expected {fmt(expected)}, got {fmt(actual)}"
    raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")


# ---------------------------------------------------------------- check_previous_token_score


def _prev_cases() -> list[tuple[str, Tensor]]:
    """(description, pattern) from hand-built to random, batched and float64."""
    return [
        ("a perfect previous-token head with T = 5 (query t attends to key t - 1)", _shifted(5, 1)),
        ("a head that attends to itself, T = 4 (the main diagonal)", _shifted(4, 0)),
        ("random causal weights of shape (6, 6)", _causal_pattern((6, 6), 1)),
        ("the smallest case, T = 2", _causal_pattern((2, 2), 2)),
        ("random causal weights of shape (B, h, T, T) = (2, 3, 7, 7)", _causal_pattern((2, 3, 7, 7), 3)),
        ("float64 weights of shape (3, 5, 5)", _causal_pattern((3, 5, 5), 4, torch.float64)),
    ]


def _prev_mistake(pattern: Tensor, actual: Tensor) -> str | None:
    """Name the slip when ``actual`` equals what a plausible wrong answer computes."""
    T = pattern.shape[-1]
    diag = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)  # (..., T - 1)
    wrong = {
        "you averaged the diagonal above the main one (offset=+1, the next token, which a causal head never "
        "sees): the previous token is offset=-1": pattern.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1),
        "you averaged the main diagonal (each token attending to itself): the previous token is the diagonal "
        "just below it, offset=-1": pattern.diagonal(dim1=-2, dim2=-1).mean(-1),
        "you divided by T instead of T - 1: query 0 has no previous token, so only the T - 1 queries "
        "t = 1 .. T - 1 count": diag.sum(-1) / T,
        "you summed the weights instead of averaging them over the T - 1 queries": diag.sum(-1),
    }
    return _unique(wrong, actual, previous_token_score(pattern))


@check("check_previous_token_score")
def check_previous_token_score(fn: Callable[[Tensor], Tensor]) -> None:
    """Chapter "What attention learns", exercise 1: check ``fn(pattern (..., T, T)) -> (...)``, the previous-token
    score.

    ``fn`` is given attention weights and returns, per pattern, the mean over queries
    ``t = 1 .. T - 1`` of ``pattern[..., t, t - 1]``, compared with
    :func:`transformer_lib.previous_token_score` on hand-built, random, batched and float64 patterns.
    """
    wrong = []
    for desc, pattern in _prev_cases():
        where = f"for {desc}"
        out = call_student(fn, (pattern,), where, inputs="pattern", crash_hint=None)
        expected = previous_token_score(pattern)
        require_tensor(
            out,
            where,
            tuple(expected.shape),
            what="the score",
            layout="(...) = pattern.shape[:-2]",
            shape_hint=": one score per pattern, the mean taken over the queries (the last two axes go)",
        )
        if out.dtype != pattern.dtype:
            raise ExerciseFailure(
                f"{where}, the score has dtype {out.dtype}; keep the pattern's dtype {pattern.dtype}."
            )
        if not close(out, expected, atol=1e-6, rtol=1e-5):
            wrong.append((where, expected, out, _prev_mistake(pattern, out)))
    _judge(wrong)


# ---------------------------------------------------------------- check_induction_score


def _ind_cases() -> list[tuple[str, Tensor, int]]:
    """(description, pattern, distance) from hand-built to random, batched and float64."""
    return [
        ("a perfect induction head with T = 8, distance = 4 (query t attends to key t - 3)", _shifted(8, 3), 4),
        ("a head that attends to the earlier copy of its own token, T = 8, distance = 4", _shifted(8, 4), 4),
        ("random causal weights of shape (9, 9), distance = 3", _causal_pattern((9, 9), 5), 3),
        ("distance = 1 (every token repeats the one before), T = 5", _causal_pattern((5, 5), 6), 1),
        ("random weights of shape (B, h, T, T) = (2, 2, 10, 10), distance = 5", _causal_pattern((2, 2, 10, 10), 7), 5),
        ("float64 weights of shape (3, 6, 6), distance = 2", _causal_pattern((3, 6, 6), 8, torch.float64), 2),
    ]


def _key_mean(pattern: Tensor, distance: int, shift: int, first: int) -> Tensor:
    """Mean of ``pattern[..., t, t - distance + shift]`` over ``t = first .. T - 1`` (keys clamped)."""
    T = pattern.shape[-1]
    t = torch.arange(first, T)
    return pattern[..., t, (t - distance + shift).clamp(0, T - 1)].mean(-1)


def _ind_mistake(pattern: Tensor, distance: int, actual: Tensor) -> str | None:
    """Name the slip when ``actual`` equals what a plausible wrong answer computes."""
    right = induction_score(pattern, distance)
    wrong = {
        "you read key t - distance, the earlier copy of the query's own token (a duplicate-token head): an "
        "induction head attends to the token after it, key t - distance + 1": _key_mean(pattern, distance, 0, distance),
        "you read key t - distance + 2, one too far: the token that followed the earlier copy is at "
        "t - distance + 1": _key_mean(pattern, distance, 2, distance),
        "you averaged over every query, including t < distance, which has no earlier copy: only "
        "t = distance .. T - 1 count": _key_mean(pattern, distance, 1, 0),
        "you averaged over t = distance + 1 .. T - 1 and left out the first query of the repeat, "
        "t = distance": _key_mean(pattern, distance, 1, distance + 1),
    }
    return _unique(wrong, actual, right)


@check("check_induction_score")
def check_induction_score(fn: Callable[[Tensor, int], Tensor]) -> None:
    """Chapter "What attention learns", exercise 2: check ``fn(pattern (..., T, T), distance) -> (...)``, the induction
    score.

    ``fn`` is given attention weights and the repeat's distance and returns, per pattern, the
    mean over queries ``t = distance .. T - 1`` of ``pattern[..., t, t - distance + 1]``,
    compared with :func:`transformer_lib.induction_score` on hand-built, random, batched and
    float64 patterns.
    """
    wrong = []
    for desc, pattern, distance in _ind_cases():
        where = f"for {desc}"
        out = call_student(fn, (pattern, distance), where, inputs="pattern", crash_hint=None)
        expected = induction_score(pattern, distance)
        require_tensor(
            out,
            where,
            tuple(expected.shape),
            what="the score",
            layout="(...) = pattern.shape[:-2]",
            shape_hint=": one score per pattern, the mean taken over the queries (the last two axes go)",
        )
        if not close(out, expected, atol=1e-6, rtol=1e-5):
            wrong.append((where, expected, out, _ind_mistake(pattern, distance, out)))
    _judge(wrong)
