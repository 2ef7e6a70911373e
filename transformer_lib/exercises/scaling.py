"""Checks for chapter "Why divide by sqrt(d_k)".

- :func:`check_scaled_scores`: the student's ``scaled_scores(q, k)`` returns ``q k^T / sqrt(d_k)``.
- :func:`check_softmax_jacobian`: the student's ``softmax_jacobian(p)`` returns ``diag(p) - p p^T``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ._core import ExerciseFailure, call_student, check, close, fmt, require_shape, require_tensor

__all__ = ["check_scaled_scores", "check_softmax_jacobian"]


# --------------------------------------------------------------------------------------------
# Exercise ex-03-2: scaled scores
# --------------------------------------------------------------------------------------------

# (batch shape, T_q, T_k, d_k, dtype), smallest first. The sizes are chosen so that sqrt(d_k),
# d_k, T_q, T_k and their square roots all differ, which lets the check name the mistake.
_SCORE_CASES = [
    ((), 1, 1, 1, torch.float32),
    ((), 2, 3, 16, torch.float32),
    ((), 3, 5, 9, torch.float64),
    ((2, 3), 4, 6, 25, torch.float32),
]


def _diagnose_scores(out: torch.Tensor, expected: torch.Tensor, T_q: int, T_k: int, d_k: int) -> str:
    """A sentence naming the likely mistake when ``out`` has the right shape but wrong values."""
    r = math.sqrt(d_k)
    if close(out, expected * r):
        return (
            f"your scores are sqrt(d_k) = {r:g} times too large: it looks like q k^T was not scaled at all; "
            "divide it by sqrt(d_k)."
        )
    if close(out, expected / r):
        return (
            f"your scores are sqrt(d_k) = {r:g} times too small: it looks like you divided by d_k = {d_k}; "
            "divide by its square root."
        )
    if close(out, expected * d_k):
        return "your scores are d_k times too large: it looks like you multiplied by sqrt(d_k) instead of dividing."
    for name, n in (("T_q", T_q), ("T_k", T_k)):
        for label, c in ((f"sqrt({name}) = {math.sqrt(n):g}", math.sqrt(n)), (f"{name} = {n}", float(n))):
            if c != r and close(out, expected * r / c):
                return (
                    f"it looks like you divided by {label}, a length, instead of sqrt(d_k) = {r:g}: "
                    "d_k is the last axis of q and k, the width of each query and key."
                )
    return ""


_DTYPE_HINT = ": keep the input's dtype (do not convert to another dtype or to NumPy)"


@check("scaled scores")
def check_scaled_scores(fn: Callable) -> None:
    """Chapter "Why divide by sqrt(d_k)", exercise 2: check ``fn(q, k)`` returns ``q k^T / sqrt(d_k)`` of shape ``(...,
    T_q, T_k)``.

    ``fn`` is given ``q (..., T_q, d_k)`` and ``k (..., T_k, d_k)``, first 2-D, then with batch
    axes ``(2, 3)``, in float32 and float64. Rejects, with a message naming the mistake: no
    scaling, dividing by ``d_k``, multiplying by ``sqrt(d_k)``, dividing by a sequence length,
    transposed scores, and 2-D-only code that breaks on batched inputs.
    """
    gen = torch.Generator().manual_seed(3)
    for batch, T_q, T_k, d_k, dtype in _SCORE_CASES:
        q = torch.randn(*batch, T_q, d_k, generator=gen, dtype=dtype)
        k = torch.randn(*batch, T_k, d_k, generator=gen, dtype=dtype)
        where = f"For q of shape {tuple(q.shape)} and k of shape {tuple(k.shape)} (T_q={T_q}, T_k={T_k}, d_k={d_k})"
        hint = (
            " Batched inputs (B, h, T, d_k) need k.transpose(-2, -1) rather than k.T, and d_k = q.shape[-1]."
            if batch
            else ""
        )
        out = call_student(
            fn, (q, k), where, crash_hint=hint.strip(), inputs="q or k", in_place_hint="compute a new tensor instead"
        )
        expected = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
        require_tensor(out, where, dtype=dtype, what="the scores", dtype_hint=_DTYPE_HINT)
        if T_q != T_k and out.shape == expected.transpose(-2, -1).shape:
            shape_hint = ": one row per query, so compute q times k transposed, not k times q transposed"
        else:
            shape_hint = "." + hint
        require_shape(out, expected.shape, where, what="the scores", layout="(..., T_q, T_k)", hint=shape_hint)
        if close(out, expected):
            continue
        reason = _diagnose_scores(out, expected, T_q, T_k, d_k)
        if not reason and batch:
            reason = "the values are wrong for this batched input (the 2-D cases passed)." + hint
        if not reason:
            reason = "the values are wrong."
        raise ExerciseFailure(
            f"{where}, {reason} Expected {fmt(expected.flatten()[:4])}..., got {fmt(out.flatten()[:4])}..."
        )


# --------------------------------------------------------------------------------------------
# Exercise ex-03-3: the softmax Jacobian
# --------------------------------------------------------------------------------------------


def _jacobian_cases(gen: torch.Generator) -> list[torch.Tensor]:
    """Softmax outputs ``p`` to test on, smallest first; each is a tensor of shape ``(..., n)``."""
    return [
        torch.tensor([1.0]),
        torch.tensor([0.2, 0.3, 0.5]),
        torch.tensor([0.0, 1.0, 0.0]),
        torch.softmax(torch.randn(2, 4, generator=gen), dim=-1),
        torch.softmax(torch.randn(2, 3, 5, generator=gen, dtype=torch.float64), dim=-1),
    ]


def _diagnose_jacobian(out: torch.Tensor, p: torch.Tensor) -> str:
    diag = torch.diag_embed(p)
    outer = p.unsqueeze(-1) * p.unsqueeze(-2)
    if close(out, diag):
        return (
            "you returned diag(p) only; the off-diagonal entries -p_i p_j are missing: "
            "subtract the outer product p p^T."
        )
    if close(out, -(diag - outer)):
        return "the sign is flipped: the Jacobian is diag(p) - p p^T, not p p^T - diag(p)."
    if close(out, torch.diag_embed(p - p * p)):
        return (
            "the diagonal p_i (1 - p_i) is right but every off-diagonal entry is 0; "
            "changing score j also lowers every other weight: d p_i / d s_j = -p_i p_j for i != j."
        )
    inner = (p * p).sum(-1)[..., None, None]
    if close(out, diag - inner):
        return (
            "it looks like you subtracted the inner product p . p (one number) from every entry; subtract the "
            "outer product p p^T, the (n, n) matrix with entries p_i p_j."
        )
    if close(out, diag - p.unsqueeze(-2)) or close(out, diag - p.unsqueeze(-1)):
        return "it looks like you subtracted p itself, not the outer product p p^T with entries p_i p_j."
    return ""


@check("softmax Jacobian")
def check_softmax_jacobian(fn: Callable) -> None:
    """Chapter "Why divide by sqrt(d_k)", exercise 3: check ``fn(p)`` returns the softmax Jacobian ``diag(p) - p p^T``.

    ``fn`` is given ``p (..., n)``, softmax outputs of shapes ``(1,)``, ``(3,)``, ``(2, 4)`` and
    ``(2, 3, 5)`` (the last in float64), and must return ``(..., n, n)``. Rejects, with a message
    naming the mistake: ``diag(p)`` alone, a flipped sign, only the diagonal ``p(1 - p)``, the inner
    product ``p . p`` instead of the outer product, and code that ignores leading batch axes.
    """
    gen = torch.Generator().manual_seed(3)
    for p in _jacobian_cases(gen):
        n = p.shape[-1]
        where = f"For p = {fmt(p)} (shape {tuple(p.shape)})" if p.dim() == 1 else f"For p of shape {tuple(p.shape)}"
        hint = (
            " The input has batch axes (..., n): build one (n, n) matrix per row, for example with "
            "torch.diag_embed and broadcasting, not torch.diag or torch.outer, which only take one vector."
            if p.dim() > 1
            else ""
        )
        out = call_student(
            fn, (p,), where, crash_hint=hint.strip(), inputs="p", in_place_hint="compute a new tensor instead"
        )
        expected = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., n, n)
        require_tensor(out, where, dtype=p.dtype, what="the Jacobian", dtype_hint=_DTYPE_HINT)
        require_shape(
            out,
            expected.shape,
            where,
            what="the Jacobian",
            layout="(..., n, n)",
            hint=f", one (n, n) matrix per row of p with n={n}." + hint,
        )
        if close(out, expected):
            continue
        reason = _diagnose_jacobian(out, p) or "the values are wrong."
        if p.dim() == 1 and n <= 3:
            raise ExerciseFailure(f"{where}, {reason} Expected {fmt(expected)}, got {fmt(out)}.")
        raise ExerciseFailure(
            f"{where}, {reason} First matrix expected {fmt(expected.reshape(-1, n, n)[0])}, "
            f"got {fmt(out.reshape(-1, n, n)[0])}."
        )
