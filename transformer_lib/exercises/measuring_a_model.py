"""Checks for chapter "Measuring a model": the unbiased estimator of pass@k, and a weight
quantised to 8 bits per output channel as PyTorch quantises it.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..evaluate import pass_at_k
from ..quantize import quantize_int8
from ._core import ExerciseFailure, call_student, check, fmt, require_finite, require_tensor

__all__ = ["check_pass_at_k", "check_quantize_int8"]


# ---------------------------------------------------------------------------------------------
# Exercise 1 of chapter "Measuring a model": pass@k from n samples


def _pass_mistakes(n: int, c: int, k: int) -> list[tuple[str, float]]:
    rule = (
        "pass@k = 1 - C(n - c, k) / C(n, k), the chance that k of the n answers, drawn without replacement, "
        "hold a right one"
    )
    return [
        (
            "you computed 1 - (1 - c/n)^k, which draws the k answers with replacement: the same answer can be "
            f"drawn twice, so it is biased low; {rule}",
            1 - (1 - c / n) ** k,
        ),
        (f"you returned c / n, the share of right answers: that is pass@1 whatever k is; {rule}", c / n),
        (
            "you returned C(c, k) / C(n, k), the chance that all k answers are right; pass@k asks for at least one: "
            + rule,
            math.comb(c, k) / math.comb(n, k),
        ),
        (
            f"you multiplied pass@1 by k (capped at 1): chances of overlapping events do not add; {rule}",
            min(1.0, k * c / n),
        ),
        (
            f"you returned C(n - c, k) / C(n, k), the chance that none is right: take one minus it; {rule}",
            math.comb(n - c, k) / math.comb(n, k),
        ),
    ]


_OVERFLOW = (
    "C(n, k) overflows a float for large n: use Python's integers (math.comb) or the product "
    "1 - prod over i from n - c + 1 to n of (1 - k / i)."
)


@check("check_pass_at_k")
def check_pass_at_k(fn: Callable) -> None:
    """Chapter "Measuring a model", exercise 1: check ``fn(n, c, k) -> float``, the unbiased estimate of pass@k.

    ``fn`` is given the number of sampled answers ``n``, how many of them are right ``c`` and the
    ``k`` of pass@k (``1 <= k <= n``), and returns ``1 - C(n - c, k) / C(n, k)``: the chance that
    ``k`` answers drawn from the ``n`` without replacement hold at least one right one. Tried on
    counts where every answer or none is right, ``k = 1``, ``k = n`` and large ``n`` (where the
    binomial coefficients overflow a float unless the product form or integers are used).
    """
    cases = [
        (10, 3, 1),
        (10, 3, 5),
        (5, 1, 2),
        (20, 0, 8),
        (20, 20, 8),
        (16, 2, 16),
        (8, 7, 2),
        (200, 3, 10),
        (2000, 17, 100),
    ]
    for n, c, k in cases:
        where = f"for n={n}, c={c}, k={k}"
        got = call_student(fn, (n, c, k), where, crash_hint=lambda e: _OVERFLOW if isinstance(e, OverflowError) else "")
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise ExerciseFailure(f"{where}, your function returned a {type(got).__name__}; return a number.")
        want = pass_at_k(n, c, k)
        if not math.isfinite(got):
            raise ExerciseFailure(f"{where}, your function returned {got}; {_OVERFLOW}")
        if abs(got - want) > 1e-9:
            mistake = next((m for m, w in _pass_mistakes(n, c, k) if abs(got - w) < 1e-9), None)
            detail = f"pass@k should be {want:.6f}, your function returned {got:.6f}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")


# ---------------------------------------------------------------------------------------------
# Exercise 2 of chapter "Measuring a model": 8-bit weights, one scale per output channel


def _int8_mistakes(w: Tensor) -> list[tuple[str, Tensor, Tensor]]:
    amax_rows = w.abs().amax(1)
    rule = (
        "one scale per row, s = max|W_row| / 127.5, codes round(W / s) (half to even, torch.round) clipped to "
        "[-128, 127]"
    )

    def codes(scale: Tensor, how=torch.round) -> tuple[Tensor, Tensor]:
        return how(w * (1.0 / scale)).clamp(-128, 127), scale.expand(w.shape).amax(1)

    s_tensor = (w.abs().amax() / 127.5).expand(w.shape[0], 1)
    s = (amax_rows / 127.5)[:, None]
    return [
        (m, *codes_scales)
        for m, codes_scales in [
            (
                "you used one scale for the whole matrix (per tensor): a row of small weights then gets few "
                f"codes; {rule}",
                codes(s_tensor),
            ),
            (
                f"you divided by 127, PyTorch's symmetric observer halves the full range [-128, 127]: 127.5; {rule}",
                codes((amax_rows / 127)[:, None]),
            ),
            (f"you truncated toward zero instead of rounding to the nearest code; {rule}", codes(s, torch.trunc)),
            (f"you rounded down (floor) instead of to the nearest code; {rule}", codes(s, torch.floor)),
            (
                f"you divided by 255 (the full range) instead of half of it: the codes use only half the grid; {rule}",
                codes((amax_rows / 255)[:, None]),
            ),
        ]
    ]


@check("check_quantize_int8")
def check_quantize_int8(fn: Callable) -> None:
    """Chapter "Measuring a model", exercise 2: check ``fn(w (out, in)) -> (codes (out, in) int8, scales (out,)
    float32)``.

    ``fn`` is given a float32 weight and returns PyTorch's symmetric per-channel quantisation of
    it along the output axis: for each row the scale ``s = max|W_row| / 127.5`` and the codes
    ``round(W_row / s)`` (half to even), clipped to ``[-128, 127]``, as ``torch.int8``. Compared
    code for code with :func:`transformer_lib.quantize_int8` (which equals
    ``torch.quantize_per_channel``), on rows of very different sizes; ``w`` must be left unchanged.
    """
    g = torch.Generator().manual_seed(16)
    spread = torch.logspace(-3, 1, 6)[:, None]
    cases = [
        ("a weight (6, 10) whose rows differ in size 10,000 times", torch.randn(6, 10, generator=g) * spread),
        ("a weight (4, 32)", torch.randn(4, 32, generator=g)),
        ("a weight (3, 5) with a row of zeros", torch.cat([torch.randn(2, 5, generator=g), torch.zeros(1, 5)])),
    ]
    for desc, w in cases:
        where = f"for {desc}"
        got = call_student(fn, (w,), where, inputs="w", crash_hint="")
        if not (isinstance(got, tuple) and len(got) == 2):
            raise ExerciseFailure(f"{where}, your function returned {type(got).__name__}; return (codes, scales).")
        codes, scales = got
        require_tensor(codes, where, tuple(w.shape), what="the codes", layout="(out, in)")
        require_tensor(
            scales,
            where,
            (w.shape[0],),
            what="the scales",
            layout="(out,)",
            shape_hint=": one scale per output channel, a row of the weight",
        )
        require_finite(scales.float(), where, what="the scales", hint="; a row of zeros still needs a scale > 0")
        want_codes, want_scales = quantize_int8(w)
        same_scales = torch.allclose(scales.double(), want_scales.double(), rtol=1e-6, atol=0)
        if not (same_scales and torch.equal(codes.to(want_codes.dtype), want_codes)):
            mistake = next(
                (
                    m
                    for m, c, s in _int8_mistakes(w)
                    if torch.equal(codes.float(), c) and torch.allclose(scales.double(), s.double(), rtol=1e-6, atol=0)
                ),
                None,
            )
            if mistake:
                raise ExerciseFailure(f"{where}, {mistake}.")
        if not same_scales:
            raise ExerciseFailure(
                f"{where}, the scales should be {fmt(want_scales)}, got {fmt(scales)}: s = max|W_row| / 127.5 "
                "for each row (and at least float32's eps, torch.finfo(torch.float32).eps, for a row of zeros)."
            )
        if codes.dtype != torch.int8:
            raise ExerciseFailure(f"{where}, the codes have dtype {codes.dtype}; return them as torch.int8.")
        if not torch.equal(codes, want_codes):
            row = int((codes != want_codes).any(1).nonzero()[0, 0])
            raise ExerciseFailure(
                f"{where}, row {row} of the codes should be {fmt(want_codes[row].float())}, got "
                f"{fmt(codes[row].float())}: round(W * (1 / s)) with torch.round, clipped to [-128, 127]."
            )
