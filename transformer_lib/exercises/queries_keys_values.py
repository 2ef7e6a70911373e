"""Checks for chapter "Queries, keys and values": a soft lookup and attention by hand.

Two coding exercises:

- ``soft_lookup(query, keys, values, temperature=1.0)``: one query vector against a table of
  keys; the answer is the softmax-weighted average of the values. :func:`soft_lookup` is the
  reference and :func:`check_soft_lookup` grades a student's version.
- ``attention(q, k, v)``: scaled dot-product attention returning ``(output, weights)``, graded
  by :func:`check_attention` against
  :func:`transformer_lib.attention.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..attention import scaled_dot_product_attention, soft_lookup
from ._core import (
    ExerciseFailure,
    call_student,
    check,
    close,
    fmt,
    require_dtype,
    require_finite,
    require_pair,
    require_shape,
    require_tensor,
)

__all__ = ["check_attention", "check_soft_lookup"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# check_soft_lookup


def _lookup_cases() -> list[tuple[str, Tensor, Tensor, Tensor, float]]:
    """(description, query, keys, values, temperature), smallest and friendliest first."""
    g = _gen(2)
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    cases = [
        (
            "3 keys in 2-D, numeric values, temperature 1",
            torch.tensor([1.0, 0.5]),
            keys,
            torch.tensor([1.0, 2.0, 4.0]),
            1.0,
        ),
        ("the same table with temperature 0.5", torch.tensor([1.0, 0.5]), keys, torch.tensor([1.0, 2.0, 4.0]), 0.5),
        ("a single key", torch.tensor([0.3, -2.0]), torch.tensor([[1.0, 1.0]]), torch.tensor([5.0]), 1.0),
        (
            "5 keys in 3-D with vector values (n, d_v) = (5, 2), temperature 2",
            torch.randn(3, generator=g),
            torch.randn(5, 3, generator=g),
            torch.randn(5, 2, generator=g),
            2.0,
        ),
        (
            "float64 inputs",
            torch.randn(4, generator=g, dtype=torch.float64),
            torch.randn(6, 4, generator=g, dtype=torch.float64),
            torch.randn(6, generator=g, dtype=torch.float64),
            1.0,
        ),
        (
            "large scores (about 1000)",
            torch.tensor([30.0, 30.0]),
            torch.tensor([[20.0, 15.0], [19.0, 15.0], [-5.0, 2.0]]),
            torch.tensor([1.0, 2.0, 3.0]),
            1.0,
        ),
        (
            "a small temperature 0.01, nearly a hard lookup",
            torch.tensor([1.0, 0.5]),
            keys,
            torch.tensor([1.0, 2.0, 4.0]),
            0.01,
        ),
    ]
    return cases


def _lookup_hint(actual: Tensor, query: Tensor, keys: Tensor, values: Tensor, temperature: float) -> str:
    scores = keys @ query
    if close(actual, values[scores.argmax()]):
        return (
            "your answer is the value of the single best-matching key: that is a hard lookup. A soft "
            "lookup returns the average of all values, weighted by softmax(keys @ query / temperature)."
        )
    if temperature != 1.0 and close(actual, soft_lookup(query, keys, values, 1.0)):
        return "the temperature was ignored: divide the scores by it before the softmax."
    if temperature != 1.0 and close(actual, soft_lookup(query, keys, values, 1.0 / temperature)):
        return "the scores were multiplied by the temperature; divide them by it instead."
    linear = scores / temperature
    if close(actual, (linear / linear.sum()) @ values):
        return (
            "the weights look like the scores divided by their sum. Scores can be negative or sum to "
            "zero; softmax (exponentiate, then normalise) makes every weight positive."
        )
    if close(actual, values.sum(0)) or close(actual, torch.exp(linear) @ values):
        return "the weights were not normalised: divide by their sum (softmax does both steps)."
    return "compute weights = softmax(keys @ query / temperature) over the keys, then return weights @ values."


@check("check_soft_lookup")
def check_soft_lookup(fn: Callable[..., Tensor]) -> None:
    """Chapter "Queries, keys and values", exercise 2: grade ``fn(query, keys, values, temperature)`` against
    :func:`soft_lookup`.

    ``fn`` is given ``query (d,)``, ``keys (n, d)``, ``values (n,)`` or ``(n, d_v)`` and a float
    temperature, and must return a tensor of ``values.shape[1:]``. Tries a 3-key table, a second
    temperature, a single key, vector values, float64 inputs, large scores (exp overflow) and a
    small temperature, and names the likely mistake.
    """
    for what, query, keys, values, temperature in _lookup_cases():
        expected = soft_lookup(query, keys, values, temperature)
        where = f"on {what} (query {fmt(query)}, keys {fmt(keys)}, values {fmt(values)})"
        actual = call_student(fn, (query, keys, values, temperature), where)
        require_tensor(
            actual, where, expected.shape, shape_hint=" (one value's shape: the weights combine the rows of values)"
        )
        require_finite(
            actual,
            where,
            hint=": exp of a large score overflows. Use torch.softmax, which subtracts the largest score first",
        )
        require_dtype(actual, expected.dtype, where)
        if not close(actual, expected):
            hint = _lookup_hint(actual, query, keys, values, temperature)
            raise ExerciseFailure(f"{where}, expected {fmt(expected)}, got {fmt(actual)}: {hint}")


# ---------------------------------------------------------------------------------------------
# check_attention


def _attention_cases() -> list[tuple[str, tuple[Tensor, Tensor, Tensor]]]:
    """(description, (q, k, v)), smallest and friendliest first; batched cases last."""
    g = _gen(0)

    def qkv(shape_q, shape_k, d_v, dtype=torch.float32):
        q = torch.randn(shape_q, generator=g, dtype=dtype)
        k = torch.randn(shape_k, generator=g, dtype=dtype)
        v = torch.randn((*shape_k[:-1], d_v), generator=g, dtype=dtype)
        return q, k, v

    return [
        ("q (2, 4), k (3, 4), v (3, 2)", qkv((2, 4), (3, 4), 2)),
        ("a single query and key: q (1, 1), k (1, 1), v (1, 1)", qkv((1, 1), (1, 1), 1)),
        ("odd sizes: q (5, 3), k (7, 3), v (7, 5)", qkv((5, 3), (7, 3), 5)),
        ("float64: q (3, 16), k (4, 16), v (4, 2)", qkv((3, 16), (4, 16), 2, torch.float64)),
        ("batched: q (2, 3, 6), k (2, 4, 6), v (2, 4, 5)", qkv((2, 3, 6), (2, 4, 6), 5)),
        ("batch and heads: q (2, 3, 5, 8), k (2, 3, 4, 8), v (2, 3, 4, 2)", qkv((2, 3, 5, 8), (2, 3, 4, 8), 2)),
    ]


def _weights_hint(weights: Tensor, q: Tensor, k: Tensor, batched: bool) -> str:
    """Name the likely mistake behind weights that are not softmax(q k^T / sqrt(d_k)) over the keys."""
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1)  # (..., T_q, T_k)
    w = weights.detach().double()
    if (w < 0).any():
        return "some weights are negative: apply softmax to the scores, which makes every weight positive."
    if not torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-4):
        if batched and torch.allclose(w.sum(0), torch.ones_like(w.sum(0)), atol=1e-4):
            return (
                "each weight is normalised over the batch axis (dim 0). That is what softmax without an "
                "explicit dim does for 3-D input; pass dim=-1 to normalise over the keys."
            )
        if torch.allclose(w.sum(-2), torch.ones_like(w.sum(-2)), atol=1e-4):
            where = "in batched input dim=1 is not the last axis; " if batched else ""
            return (
                f"the columns sum to 1 instead of the rows: softmax ran over the queries. {where}"
                "Normalise over the keys with dim=-1."
            )
        return (
            "the rows of weights do not sum to 1 (row sums "
            f"{fmt(w.sum(-1).flatten()[:4])}...): normalise the exponentiated scores with softmax over the keys."
        )
    if close(w, torch.softmax(scores, dim=-1)):
        return "the scores were not divided by sqrt(d_k): use q @ k^T / sqrt(d_k)."
    if close(w, torch.softmax(scores / d_k, dim=-1)):
        return "the scores were divided by d_k; divide by its square root, sqrt(d_k)."
    if close(w, torch.softmax(scores * math.sqrt(d_k), dim=-1)):
        return "the scores were multiplied by sqrt(d_k); divide by it instead."
    return "expected softmax(q @ k^T / sqrt(d_k)) over the last axis (the keys)."


_BATCH_HINT = (
    "It must work for any number of leading batch axes: transpose only the last two axes of k, "
    "k.transpose(-2, -1) (k.T and k.transpose(0, 1) are right only for 2-D k)."
)


@check("check_attention")
def check_attention(fn: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> None:
    """Chapter "Queries, keys and values", exercise 3: grade ``fn(q, k, v) -> (output, weights)`` against the library's
    attention.

    ``fn`` is given ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)`` and ``v (..., T_k, d_v)`` with no,
    one or two leading batch axes, and must return ``output (..., T_q, d_v)`` and ``weights
    (..., T_q, T_k)``. Tries 2-D inputs, a single query and key, odd sizes, float64, a batch and a
    batch of heads; checks shapes, dtype, that each row of weights sums to 1 over the keys, the
    scaling by sqrt(d_k) and that output = weights @ v, and names the likely mistake.
    """
    for what, (q, k, v) in _attention_cases():
        expected_out, expected_w = scaled_dot_product_attention(q, k, v)
        batched = q.dim() > 2
        where = f"on {what}"
        result = call_student(
            fn,
            (q, k, v),
            where,
            crash_hint=lambda exc: (
                _BATCH_HINT if batched and isinstance(exc, RuntimeError | IndexError | ValueError) else None
            ),
        )
        out, w = require_pair(result, where, ("output", "weights"))
        transposed = w.shape == expected_w.transpose(-2, -1).shape
        hint = " (transposed: the scores are q @ k^T, one row per query, not k @ q^T)" if transposed else ""
        require_shape(w, expected_w.shape, where, what="the weights", layout="(..., T_q, T_k)", hint=hint)
        require_shape(
            out, expected_out.shape, where, what="the output", layout="(..., T_q, d_v)", hint=": output = weights @ v"
        )
        for name, t in (("the output", out), ("the weights", w)):
            require_dtype(
                t, q.dtype, where, what=name, hint=": keep the inputs' dtype (do not create float32 tensors inside)"
            )
        if not close(w, expected_w):
            small = "" if batched else f" Expected weights {fmt(expected_w)}, got {fmt(w)}."
            raise ExerciseFailure(f"{where}, the weights are wrong: {_weights_hint(w, q, k, batched)}{small}")
        if not close(out, expected_out):
            hint = "output must be weights @ v (each output row is a weighted average of the rows of v)."
            small = "" if batched else f" Expected {fmt(expected_out)}, got {fmt(out)}."
            raise ExerciseFailure(f"{where}, the weights are right but the output is wrong: {hint}{small}")
