"""Checks for chapter "Attention as a recurrence": causal linear attention in its plain
form, and one write of the delta rule.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._core import ExerciseFailure, call_student, check, close, fmt, require_finite, require_tensor

__all__ = ["check_causal_linear_attention", "check_delta_write"]


def _first_mistake(wrong: list[tuple[str, Tensor | None]], actual: Tensor, right: Tensor) -> str | None:
    """The first named mistake whose result ``actual`` matches (and that differs from the right answer)."""
    for mistake, w in wrong:
        if w is not None and w.shape == actual.shape and close(actual, w) and not close(w, right):
            return mistake
    return None


def _first_row(actual: Tensor, right: Tensor, name: str) -> str:
    """Where ``actual`` first differs from ``right``: ``name[i, j] should be [...], got [...]``."""
    a, r = actual.detach().double().reshape(-1, right.shape[-1]), right.double().reshape(-1, right.shape[-1])
    bad = ~torch.isclose(a, r, atol=1e-5, rtol=1e-4).all(-1)
    i = int(bad.nonzero()[0, 0]) if bool(bad.any()) else 0
    index, rest = [], i
    for size in reversed(right.shape[:-1]):  # the row number as an index into the leading axes
        index, rest = [rest % size, *index], rest // size
    where = f"{name}[{', '.join(map(str, index))}]" if index else name
    return f"{where} should be {fmt(r[i])}, got {fmt(a[i])}"


def _verdict(where: str, mistake: str | None, detail: str) -> ExerciseFailure:
    return ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")


# ---------------------------------------------------------------------------------------------
# Exercise 1 of chapter "Attention as a recurrence": causal linear attention, the plain form


def _masked(scores: Tensor, keep: str) -> Tensor:
    """``scores (..., T, T)`` with the entries outside ``keep`` set to 0: "past" (s <= t), "strict" (s < t)
    or "future" (s >= t)."""
    T = scores.shape[-1]
    ones = torch.ones(T, T, dtype=torch.bool)
    mask = {"past": ones.tril(), "strict": ones.tril(-1), "future": ones.triu()}[keep]
    return scores.masked_fill(~mask, 0.0)


def _linear_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _masked(q @ k.transpose(-1, -2), "past") @ v


def _linear_attention_mistakes(q: Tensor, k: Tensor, v: Tensor) -> list[tuple[str, Tensor | None]]:
    scores = q @ k.transpose(-1, -2)
    causal = _masked(scores, "past")
    future = torch.ones_like(scores, dtype=torch.bool).triu(1)
    softmax = lambda s: torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)  # noqa: E731
    plain = "this exercise asks for the plain form: out_t = sum_{s <= t} (q_t . k_s) v_s"
    square = q.shape[-1] == v.shape[-1]
    return [
        (
            "you forgot the causal mask: every output also reads the later tokens' values; a running sum is the "
            "mask: out_t may only use k_s, v_s for s <= t (keep the lower triangle of q k^T, diagonal included)",
            scores @ v,
        ),
        (
            "you kept only the strict past (s < t): out_t must include the token itself, so write k_t v_t^T into "
            "the state first and read q_t S after (the diagonal of q k^T belongs to the mask, tril not tril(-1))",
            _masked(scores, "strict") @ v,
        ),
        (
            "you kept the future (the upper triangle): causal means s <= t, the lower triangle of q k^T",
            _masked(scores, "future") @ v,
        ),
        (f"you added a softmax; {plain}, no softmax, no scale, no normalisation", softmax(scores) @ v),
        (
            f"you added a softmax and a 1/sqrt(d_k) scale; {plain}, no softmax, no scale, no normalisation",
            softmax(scores / math.sqrt(q.shape[-1])) @ v,
        ),
        (f"you scaled the scores by 1/sqrt(d_k); {plain}, with no scale", causal / math.sqrt(q.shape[-1]) @ v),
        (
            f"you divided each row by its sum (normalised the weights); {plain}, with no normalisation",
            causal / causal.sum(-1, keepdim=True) @ v,
        ),
        (
            "you swapped the roles of k and v (read S q_t, or built the state v k^T): the state is "
            "S = sum_s k_s v_s^T, (d_k, d_v), and out_t = q_t S = sum_s (q_t . k_s) v_s",
            _masked(q @ v.transpose(-1, -2), "past") @ k if square else None,
        ),
    ]


@check("check_causal_linear_attention")
def check_causal_linear_attention(fn: Callable) -> None:
    """Chapter "Attention as a recurrence", exercise 1: check ``fn(q (..., T, d_k), k (..., T, d_k), v (..., T, d_v)) ->
    (..., T, d_v)``.

    ``fn`` is given queries, keys and values and returns causal linear attention in its plain form,
    ``out_t = sum_{s <= t} (q_t . k_s) v_s``: no feature map, no scale, no normalisation. Either the
    masked parallel form ``((q @ k^T) * lower triangle) @ v`` or the running state
    ``S += k_t v_t^T; out_t = q_t S`` is right. Compared with the formula on a square case (``d_k =
    d_v``), a batch of heads with ``d_k != d_v``, a single token (``T = 1``) and float64; the inputs
    must be left unchanged.
    """
    g = torch.Generator().manual_seed(17)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    f64 = torch.float64
    cases = [
        ("q, k of shape (T, d_k) = (5, 4) and v (5, 4)", r(5, 4), r(5, 4), r(5, 4)),
        ("q, k of shape (B, h, T, d_k) = (2, 3, 6, 4) and v (2, 3, 6, 5)", r(2, 3, 6, 4), r(2, 3, 6, 4), r(2, 3, 6, 5)),
        ("a single token: q, k of shape (2, 1, 3) and v (2, 1, 2)", r(2, 1, 3), r(2, 1, 3), r(2, 1, 2)),
        (
            "float64 q, k of shape (3, 7, 4) and v (3, 7, 2)",
            r(3, 7, 4, dtype=f64),
            r(3, 7, 4, dtype=f64),
            r(3, 7, 2, dtype=f64),
        ),
    ]
    for desc, q, k, v in cases:
        where = f"for {desc}"
        hint = (
            "The scores q @ k^T are (..., T, T), times v (..., T, d_v); the running state S = sum_s k_s v_s^T "
            "is (..., d_k, d_v): d_k rows (the width of q and k), d_v columns (the width of v)."
        )
        out = call_student(
            fn,
            (q, k, v),
            where,
            inputs="q, k or v",
            crash_hint=hint,
            in_place_hint="build the state, the scores and the output as new tensors",
        )
        require_tensor(
            out, where, tuple(v.shape), layout="(..., T, d_v)", shape_hint=": one row per token, as wide as v (d_v)"
        )
        require_finite(
            out,
            where,
            hint="; with no softmax after it, fill the masked scores with 0, not -inf (and start a running "
            "state from torch.zeros, not torch.empty)",
        )
        if out.dtype != q.dtype:
            raise ExerciseFailure(f"{where}, the result has dtype {out.dtype}; keep the inputs' dtype {q.dtype}.")
        q64, k64, v64 = q.double(), k.double(), v.double()
        right = _linear_attention(q64, k64, v64)
        if not close(out, right):
            mistake = _first_mistake(_linear_attention_mistakes(q64, k64, v64), out, right)
            raise _verdict(where, mistake, _first_row(out, right, "out"))


# ---------------------------------------------------------------------------------------------
# Exercise 2 of chapter "Attention as a recurrence": one write of the delta rule


def _read(state: Tensor, k: Tensor) -> Tensor:
    """``S^T k (..., d_v)``: what the state holds for the key ``k``."""
    return (state * k[..., :, None]).sum(-2)


def _write(state: Tensor, k: Tensor, u: Tensor, beta: Tensor | float) -> Tensor:
    """``S + beta k u^T``."""
    b = beta[..., None, None] if isinstance(beta, Tensor) else beta
    return state + b * k[..., :, None] * u[..., None, :]


def _delta_mistakes(state: Tensor, k: Tensor, v: Tensor, beta: Tensor) -> list[tuple[str, Tensor | None]]:
    read, b = _read(state, k), beta[..., None, None]
    square = state.shape[-1] == state.shape[-2]
    read_sk = (state * k[..., None, :]).sum(-1) if square else None  # S k
    rule = "the new state is S + beta k (v - S^T k)^T"
    return [
        (
            "you made the plain linear-attention write S + beta k v^T: it writes v whole, on top of what the "
            "state already holds for k. The delta rule writes what the state got wrong, v - S^T k",
            _write(state, k, v, beta),
        ),
        (
            "a sign is wrong: the error is v - S^T k (what you want minus what the state holds), not v + S^T k",
            _write(state, k, v + read, beta),
        ),
        (
            "you left beta out, which makes a full write every time; scale the correction by beta: " + rule,
            _write(state, k, v - read, 1.0),
        ),
        (
            f"beta scales the whole error, beta (v - S^T k), not v alone; {rule}",
            _write(state, k, beta[..., None] * v - read, 1.0),
        ),
        (
            "you read S k where the state holds S^T k (a sum over d_k, the rows of S): the state maps a key "
            f"(d_k,) to a value (d_v,) through its transpose; {rule}",
            _write(state, k, v - read_sk, beta) if square else None,
        ),
        (
            "you wrote the outer product transposed, (v - S^T k) k^T: the write is k (v - S^T k)^T, "
            f"(d_k, d_v), with k along the rows; {rule}",
            state + b * (v - read)[..., :, None] * k[..., None, :] if square else None,
        ),
        (
            "you read S k and wrote the outer product transposed: the state is (d_k, d_v), keys along the rows; "
            + rule,
            state + b * (v - read_sk)[..., :, None] * k[..., None, :] if square else None,
        ),
    ]


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


@check("check_delta_write")
def check_delta_write(fn: Callable) -> None:
    """Chapter "Attention as a recurrence", exercise 2: check ``fn(state (..., d_k, d_v), k, v, beta) -> (..., d_k,
    d_v)``, a delta write.

    ``fn`` is given a state, a unit key ``k (..., d_k)``, a value ``v (..., d_v)`` and a write
    strength ``beta (...)`` in (0, 1]; it returns the new state ``S + beta k (v - S^T k)^T``, the
    delta rule: read what the state holds for ``k``, ``S^T k``, and write ``beta`` times the error.
    With ``beta = 1`` the new state gives back exactly ``v`` for ``k``. Compared with the formula on
    square states (where a transposed read or write has the right shape), one with ``beta = 1``, a
    batch with ``d_k != d_v`` and float64; ``state`` must not be changed in place.
    """
    g = torch.Generator().manual_seed(172)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    u = lambda *shape, dtype=torch.float32: 0.2 + 0.7 * torch.rand(*shape, generator=g, dtype=dtype)  # noqa: E731
    f64 = torch.float64
    cases = [
        ("one square state (4, 4) with beta = 1", r(4, 4), _unit(r(4)), r(4), torch.tensor(1.0)),
        ("a batch of 3 square states (3, 4, 4), beta in (0, 1)", r(3, 4, 4), _unit(r(3, 4)), r(3, 4), u(3)),
        ("states of shape (B, h, d_k, d_v) = (2, 3, 5, 2)", r(2, 3, 5, 2), _unit(r(2, 3, 5)), r(2, 3, 2), u(2, 3)),
        (
            "float64 states (2, 6, 3)",
            r(2, 6, 3, dtype=f64),
            _unit(r(2, 6, dtype=f64)),
            r(2, 3, dtype=f64),
            u(2, dtype=f64),
        ),
    ]
    for desc, state, k, v, beta in cases:
        where = f"for {desc}"
        hint = (
            "The state is (..., d_k, d_v): S^T k sums over d_k, the rows, giving (..., d_v), and the write "
            "k (v - S^T k)^T is an outer product (..., d_k, d_v); beta (...) needs two new axes to scale it."
        )
        out = call_student(
            fn,
            (state, k, v, beta),
            where,
            inputs="state, k, v or beta",
            crash_hint=hint,
            in_place_hint="return state + ..., a new tensor, instead of state += ... (the caller keeps the old state)",
        )
        require_tensor(
            out, where, tuple(state.shape), what="the new state", layout="(..., d_k, d_v), the state's shape"
        )
        require_finite(out, where, what="the new state")
        if out.dtype != state.dtype:
            raise ExerciseFailure(
                f"{where}, the new state has dtype {out.dtype}; keep the state's dtype {state.dtype}."
            )
        s64, k64, v64, b64 = state.double(), k.double(), v.double(), beta.double()
        right = _write(s64, k64, v64 - _read(s64, k64), b64)
        if not close(out, right):
            mistake = _first_mistake(_delta_mistakes(s64, k64, v64, b64), out, right)
            detail = _first_row(out, right, "new_state")
            if bool((beta == 1).all()):
                detail += (
                    f". With beta = 1 the new state must give back v exactly for k (new_state^T k = v = {fmt(v)}); "
                    f"yours gives {fmt(_read(out.detach().double(), k64))}"
                )
            raise _verdict(where, mistake, detail)
