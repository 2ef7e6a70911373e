"""Checks for chapter "A GPT from scratch": the inputs and targets of a language model, and
top-k filtering of the next-token logits.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..data import get_batch
from ._core import ExerciseFailure, call_student, check, fmt, require_pair, require_tensor

__all__ = ["check_lm_targets", "check_top_k_filter", "reference_top_k_logits"]


# ---------------------------------------------------------------- check_lm_targets


def _windows(data: Tensor, starts: Tensor, T: int, shift: int) -> Tensor:
    """Rows ``data[s + shift : s + shift + T]`` for each start ``s``, as a ``(B, T)`` tensor."""
    return torch.stack([data[int(s) + shift : int(s) + shift + T] for s in starts])


def _lm_cases() -> list[tuple[str, Tensor, Tensor, int]]:
    """(description, data (N,), starts (B,), context_len) from simple to edge cases."""
    g = torch.Generator().manual_seed(9)
    cases = []
    data = torch.arange(100, 120)  # distinct ids, so every slip shows
    cases.append(("data = torch.arange(100, 120), starts = [2, 9], context_len = 4", data, torch.tensor([2, 9]), 4))
    data = torch.randint(0, 50, (64,), generator=g)
    cases.append(("64 random ids, starts = [3, 17, 40], context_len = 8", data, torch.tensor([3, 17, 40]), 8))
    cases.append(("context_len = 1, a single start", torch.arange(10, 15), torch.tensor([2]), 1))
    data = torch.arange(200, 210)
    cases.append(
        (
            "the last possible start: data of 10 ids, context_len = 6, starts = [0, 3]",
            data,
            torch.tensor([0, 3]),
            6,
        )
    )
    return cases


@check("check_lm_targets")
def check_lm_targets(fn: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]) -> None:
    """Chapter "A GPT from scratch", exercise 1: check ``fn(data, starts, context_len) -> (x (B, T), y (B, T))``, ``y``
    the next tokens.

    ``fn`` is given ``data (N,)`` long token ids, ``starts (B,)`` long offsets and the int
    ``context_len = T``. ``x[b] = data[starts[b] : starts[b] + T]`` and
    ``y[b] = data[starts[b] + 1 : starts[b] + T + 1]``; the last case draws the starts as
    :func:`transformer_lib.data.get_batch` does and compares with it.
    """
    for desc, data, starts, T in _lm_cases():
        where = f"for {desc}"
        x, y = require_pair(call_student(fn, (data, starts, T), where), where, ("x", "y"))
        for name, t in (("x", x), ("y", y)):
            require_tensor(
                t,
                where,
                (len(starts), T),
                data.dtype,
                what=name,
                layout="(B, T)",
                shape_hint=": one row per start, context_len tokens per row (x and y both have exactly "
                "context_len tokens)",
                dtype_hint=" (an embedding layer and the cross-entropy loss need integer ids)",
            )
        expected_x, expected_y = _windows(data, starts, T, 0), _windows(data, starts, T, 1)
        if torch.equal(x, expected_y) and torch.equal(y, expected_x):
            raise ExerciseFailure(
                f"for {desc}, x and y are swapped: the input is the window that starts at `start`, the target "
                f"the same window moved one token later. Expected x = {fmt(expected_x)}, y = {fmt(expected_y)}."
            )
        if not torch.equal(x, expected_x):
            raise ExerciseFailure(
                f"for {desc}, x should be the context_len tokens starting at each start, data[start : start + "
                f"context_len]. Expected {fmt(expected_x)}, got {fmt(x)}."
            )
        if torch.equal(y, x):
            raise ExerciseFailure(
                f"for {desc}, your targets equal the inputs (no shift). A model trained that way only learns to "
                f"copy the token it already sees through the causal mask. The target at position t is the "
                f"token that comes next, data[start + t + 1]. Expected y = {fmt(expected_y)}, got {fmt(y)}."
            )
        if all(s >= 1 for s in starts.tolist()) and torch.equal(y, _windows(data, starts, T, -1)):
            raise ExerciseFailure(
                f"for {desc}, your targets are shifted the wrong way: y[t] is the token *before* x[t] "
                f"(data[start + t - 1]), which the model has already seen. The target is the next token, "
                f"data[start + t + 1]. Expected y = {fmt(expected_y)}, got {fmt(y)}."
            )
        if not torch.equal(y, expected_y):
            raise ExerciseFailure(
                f"for {desc}, y[b, t] should be data[starts[b] + t + 1], the token that follows x[b, t]. "
                f"Expected {fmt(expected_y)}, got {fmt(y)}."
            )
    _check_against_get_batch(fn)


def _check_against_get_batch(fn: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]) -> None:
    """The same windows as the library's sampler draws, for the same random starts."""
    data = torch.randint(0, 30, (50,), generator=torch.Generator().manual_seed(3))
    expected = get_batch(data, 7, 5, generator=torch.Generator().manual_seed(4))
    starts = torch.randint(len(data) - 7, (5,), generator=torch.Generator().manual_seed(4))
    where = "for random starts drawn as get_batch draws them"
    x, y = require_pair(call_student(fn, (data, starts, 7), where), where, ("x", "y"))
    if not (torch.equal(x, expected[0]) and torch.equal(y, expected[1])):
        raise ExerciseFailure(
            "on random starts, your (x, y) differ from transformer_lib.data.get_batch's for the same starts."
        )


# ---------------------------------------------------------------- check_top_k_filter


def reference_top_k_logits(logits: Tensor, k: int) -> Tensor:
    """Every logit below the ``k``-th largest of its row (last axis) set to ``-inf``; ties are kept.

    The filter :meth:`~transformer_lib.models.GPT.generate` applies with ``top_k`` (chapter "A GPT from scratch"). A new
    tensor is returned; with ``k >= V`` nothing is removed.
    """
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_k_cases() -> list[tuple[str, Tensor, int]]:
    """(description, logits, k), from simple to edge cases."""
    g = torch.Generator().manual_seed(7)
    return [
        (
            "logits [[1.0, 3.0, 0.5, 2.0, -1.0, 0.0], [0.0, -2.0, 1.5, 0.5, 2.5, 1.0]] (B = 2, V = 6), k = 2",
            torch.tensor([[1.0, 3.0, 0.5, 2.0, -1.0, 0.0], [0.0, -2.0, 1.5, 0.5, 2.5, 1.0]]),
            2,
        ),
        ("random logits of shape (3, 7), k = 3", torch.randn(3, 7, generator=g), 3),
        ("random logits of shape (2, 5), k = 1 (greedy)", torch.randn(2, 5, generator=g), 1),
        ("random float64 logits of shape (4, 9), k = 4", torch.randn(4, 9, generator=g, dtype=torch.float64), 4),
        ("random logits of shape (2, 3, 6) (a batch of sequences), k = 2", torch.randn(2, 3, 6, generator=g), 2),
        ("a 1-D tensor of logits (V = 5), k = 2", torch.randn(5, generator=g), 2),
        ("logits [[3.0, 2.0, 2.0, 1.0]] with a tie at the k-th place, k = 2", torch.tensor([[3.0, 2.0, 2.0, 1.0]]), 2),
        ("random logits of shape (2, 6), k = 6 (= vocab_size)", torch.randn(2, 6, generator=g), 6),
        ("random logits of shape (2, 6), k = 10 (> vocab_size)", torch.randn(2, 6, generator=g), 10),
    ]


def _where(index: tuple[int, ...]) -> str:
    """``row (i, j)`` for a leading index, ``the row`` for a 1-D input."""
    if not index:
        return "the row"
    return f"row {index[0]}" if len(index) == 1 else f"row {index}"


def _top_k_crash_hint(logits: Tensor, k: int) -> Callable[[Exception], str | None]:
    """The hint for the typical crashes of a top-k filter on these logits."""

    def hint(exc: Exception) -> str | None:
        if not isinstance(exc, RuntimeError | IndexError):
            return None
        if k > logits.shape[-1]:
            return (
                "When k is at least the vocabulary size there is nothing to remove: return the logits unchanged "
                "(for example use min(k, vocab_size) with torch.topk)."
            )
        if logits.dim() != 2:
            return (
                "The logits may have any number of leading axes, (..., vocab_size), not only (B, vocab_size): "
                "work on the last axis (dim=-1) and index it with `...`, for example values[..., -1:] rather than "
                "values[:, [-1]]."
            )
        return None

    return hint


@check("check_top_k_filter")
def check_top_k_filter(fn: Callable[[Tensor, int], Tensor]) -> None:
    """Chapter "A GPT from scratch", exercise 3: check ``fn(logits, k)``: all but the ``k`` largest logits of each row
    set to ``-inf``.

    ``fn`` is given ``logits (..., vocab_size)`` (1-D, ``(B, vocab_size)`` or ``(B, T, vocab_size)``;
    float32 or float64) and an int ``k`` from 1 to more than ``vocab_size``, and must return a new
    tensor of the logits' shape and dtype, keeping ties at the k-th place.
    """
    for desc, logits, k in _top_k_cases():
        where = f"for {desc}"
        out = call_student(
            fn,
            (logits, k),
            where,
            crash_hint=_top_k_crash_hint(logits, k),
            inputs="the logits it was given",
            in_place_hint="return a new tensor (for example with masked_fill, not masked_fill_), so the caller's "
            "logits stay intact",
        )
        require_tensor(out, where, logits.shape, logits.dtype, what="the filtered logits")
        _diagnose_top_k(desc, logits, k, out.detach())


def _kept_count_hint(desc: str, k: int, V: int, got: int, want: int) -> str:
    """Why a row of filtered logits keeps ``got`` tokens where it should keep ``want``."""
    if got > want:
        return f"you kept logits below the k-th largest (more than the k = {k} largest)"
    if k >= V:
        return f"k = {k} is at least V = {V}, so every logit must be kept"
    if "tie" in desc:
        return (
            "two logits tie at the k-th place: keep every logit >= the k-th largest value (as "
            "GPT.generate does), so both tied logits stay"
        )
    return (
        "the k-th largest logit must stay too (keep logits >= the k-th largest, not > it; "
        "torch.topk(logits, k).values[..., -1:] is the k-th largest)"
    )


def _diagnose_top_k(desc: str, logits: Tensor, k: int, out: Tensor) -> None:
    """Raise ExerciseFailure naming the first problem of filtered logits ``out`` of the logits' shape."""
    expected = reference_top_k_logits(logits, k)
    keep = torch.isfinite(expected)  # (..., vocab_size)
    if logits.dim() >= 2 and 1 <= k <= logits.shape[0] and not torch.equal(out, expected):
        wrong_axis = reference_top_k_logits(logits.transpose(0, -1), k).transpose(0, -1)
        if torch.equal(out, wrong_axis):
            raise ExerciseFailure(
                f"for {desc}, you picked the top k along the first axis (across the batch) instead of the "
                f"last one (across the vocabulary): each row needs its own k most likely tokens. Use "
                f"dim=-1 in torch.topk and keep the k-th value's last axis (values[..., -1:]) for broadcasting."
            )
    if torch.allclose(out.double(), torch.softmax(expected.double(), dim=-1), atol=1e-6):
        raise ExerciseFailure(
            f"for {desc}, you returned probabilities; return the filtered *logits* (the kept ones "
            f"unchanged), so that the caller can still divide them by a temperature before the softmax."
        )
    probs = torch.softmax(out.double(), dim=-1)  # a removed token must get probability exactly 0
    leaked = ~keep & (out != logits) & (probs > 0)
    if leaked.any():
        idx = tuple(torch.nonzero(leaked)[0].tolist())
        value = out[idx].item()
        hint = (
            " 0 is an ordinary logit (exp(0) = 1), so the token can still be sampled; use float('-inf')."
            if value == 0
            else " Use float('-inf'), so that softmax gives the removed tokens probability exactly 0."
        )
        raise ExerciseFailure(
            f"for {desc}, the logit at index {idx} should be removed (it is below the k-th largest), but "
            f"you set it to {value:.4g}.{hint}"
        )
    n_kept, n_expected = (probs > 0).sum(-1), keep.sum(-1)  # (...,)
    if not torch.equal(n_kept, n_expected):
        idx = tuple(torch.nonzero(n_kept != n_expected)[0].tolist())
        got, want = int(n_kept[idx]), int(n_expected[idx])
        why = _kept_count_hint(desc, k, logits.shape[-1], got, want)
        raise ExerciseFailure(
            f"for {desc}, {_where(idx)} keeps {got} logit{'' if got == 1 else 's'}, expected {want}: {why}. "
            f"Expected {fmt(expected[idx])}, got {fmt(out[idx])}."
        )
    kept_changed = keep & (out != logits)
    if kept_changed.any():
        idx = tuple(torch.nonzero(kept_changed)[0].tolist())
        raise ExerciseFailure(
            f"for {desc}, the logit at index {idx} is among the k largest and must be returned unchanged "
            f"({logits[idx].item():.4f}); got {out[idx].item():.4f}."
        )
    if not torch.equal(probs > 0, keep):
        raise ExerciseFailure(
            f"for {desc}, you kept the wrong logits: keep the k largest of each row. Expected "
            f"{fmt(expected)}, got {fmt(out)}."
        )
