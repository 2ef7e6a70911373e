"""Checks for chapter 3, "Why divide by sqrt(d_k)".

- :func:`check_scaled_scores`: the student's ``scaled_scores(q, k)`` returns ``q k^T / sqrt(d_k)``.
- :func:`check_softmax_jacobian`: the student's ``softmax_jacobian(p)`` returns ``diag(p) - p p^T``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ._core import ExerciseFailure, check, close, fmt

__all__ = ["check_scaled_scores", "check_softmax_jacobian"]


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _call(fn: Callable, args: tuple, where: str, hint: str = ""):
    """Call the student's function; turn a crash (not a stub) into a sentence about the input."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise ExerciseFailure(f"{where} your function raised {type(exc).__name__}: {exc}.{hint}") from None


def _require_tensor(out, where: str, dtype: torch.dtype) -> None:
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailure(
            f"{where} your function returned an object of type {type(out).__name__}; return a torch.Tensor."
        )
    if out.dtype != dtype:
        raise ExerciseFailure(
            f"{where} the result has dtype {out.dtype}, expected {dtype}: keep the input's dtype "
            "(do not convert to another dtype or to NumPy)."
        )


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


@check("scaled scores")
def check_scaled_scores(fn: Callable) -> None:
    """Check ``fn(q, k)`` returns ``q k^T / sqrt(d_k)`` of shape ``(..., T_q, T_k)``.

    ``q`` is ``(..., T_q, d_k)`` and ``k`` is ``(..., T_k, d_k)``. Rejects, with a message naming
    the mistake: no scaling, dividing by ``d_k``, multiplying by ``sqrt(d_k)``, dividing by a
    sequence length, transposed scores, and 2-D-only code that breaks on batched inputs.
    """
    gen = torch.Generator().manual_seed(3)
    for batch, T_q, T_k, d_k, dtype in _SCORE_CASES:
        q = torch.randn(*batch, T_q, d_k, generator=gen, dtype=dtype)
        k = torch.randn(*batch, T_k, d_k, generator=gen, dtype=dtype)
        q_in, k_in = q.clone(), k.clone()
        where = f"For q of shape {tuple(q.shape)} and k of shape {tuple(k.shape)} (T_q={T_q}, T_k={T_k}, d_k={d_k}),"
        hint = (
            " Batched inputs (B, h, T, d_k) need k.transpose(-2, -1) rather than k.T, and d_k = q.shape[-1]."
            if batch
            else ""
        )
        out = _call(fn, (q_in, k_in), where, hint)
        if not (torch.equal(q_in, q) and torch.equal(k_in, k)):
            raise ExerciseFailure(f"{where} your function changed q or k in place; compute a new tensor instead.")
        expected = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
        _require_tensor(out, where, dtype)
        if out.shape != expected.shape:
            if T_q != T_k and out.shape == expected.transpose(-2, -1).shape:
                raise ExerciseFailure(
                    f"{where} the scores have shape {tuple(out.shape)} but should be (..., T_q, T_k) = "
                    f"{tuple(expected.shape)}: one row per query, so compute q times k transposed, not k times q "
                    "transposed."
                )
            raise ExerciseFailure(
                f"{where} expected scores of shape (..., T_q, T_k) = {tuple(expected.shape)}, "
                f"got {tuple(out.shape)}.{hint}"
            )
        if close(out, expected):
            continue
        reason = _diagnose_scores(out, expected, T_q, T_k, d_k)
        if not reason and batch:
            reason = "the values are wrong for this batched input (the 2-D cases passed)." + hint
        if not reason:
            reason = "the values are wrong."
        raise ExerciseFailure(
            f"{where} {reason} Expected {fmt(expected.flatten()[:4])}..., got {fmt(out.flatten()[:4])}..."
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
    """Check ``fn(p)`` returns the softmax Jacobian ``diag(p) - p p^T`` of shape ``(..., n, n)``.

    ``p`` is a ``(..., n)`` tensor of softmax outputs. Rejects, with a message naming the mistake:
    ``diag(p)`` alone, a flipped sign, only the diagonal ``p(1 - p)``, the inner product ``p . p``
    instead of the outer product, and code that ignores leading batch axes.
    """
    gen = torch.Generator().manual_seed(3)
    for p in _jacobian_cases(gen):
        n = p.shape[-1]
        where = f"For p = {fmt(p)} (shape {tuple(p.shape)})," if p.dim() == 1 else f"For p of shape {tuple(p.shape)},"
        hint = (
            " The input has batch axes (..., n): build one (n, n) matrix per row, for example with "
            "torch.diag_embed and broadcasting, not torch.diag or torch.outer, which only take one vector."
            if p.dim() > 1
            else ""
        )
        p_in = p.clone()
        out = _call(fn, (p_in,), where, hint)
        if not torch.equal(p_in, p):
            raise ExerciseFailure(f"{where} your function changed p in place; compute a new tensor instead.")
        expected = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., n, n)
        _require_tensor(out, where, p.dtype)
        if out.shape != expected.shape:
            raise ExerciseFailure(
                f"{where} expected a Jacobian of shape (..., n, n) = {tuple(expected.shape)}, one (n, n) matrix "
                f"per row of p with n={n}, got {_shape(out)}.{hint}"
            )
        if close(out, expected):
            continue
        reason = _diagnose_jacobian(out, p) or "the values are wrong."
        if p.dim() == 1 and n <= 3:
            raise ExerciseFailure(f"{where} {reason} Expected {fmt(expected)}, got {fmt(out)}.")
        raise ExerciseFailure(
            f"{where} {reason} First matrix expected {fmt(expected.reshape(-1, n, n)[0])}, "
            f"got {fmt(out.reshape(-1, n, n)[0])}."
        )
