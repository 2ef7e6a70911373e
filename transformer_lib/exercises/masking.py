"""Checks for chapter "Masking": a causal mask and a masked softmax written by the student.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..attention import masked_softmax
from ..masks import causal_mask, combine_masks, padding_mask
from ._core import ExerciseFailure, call_student, check, close, fmt, require_tensor

__all__ = ["check_causal_mask", "check_masked_softmax"]


def _diagnose_causal(mask: Tensor, T: int) -> None:
    """Raise ExerciseFailure describing the first wrong entry of a (T, T) bool mask."""
    expected = causal_mask(T)
    if torch.equal(mask, expected):
        return
    future = torch.nonzero(mask & ~expected)
    if len(future):
        i, j = future[0].tolist()
        raise ExerciseFailure(
            f"row {i} attends to position {j}, which is in the future (T={T}): a query may only see "
            f"keys at positions <= its own. Expected {fmt(expected)}, got {fmt(mask)}."
        )
    diagonal = torch.nonzero(~mask.diagonal())
    if len(diagonal):
        i = diagonal[0].item()
        raise ExerciseFailure(
            f"row {i} may not attend to itself (position {i}) for T={T}: the causal mask keeps the "
            f"diagonal, because a token may look at itself and at the past. Expected {fmt(expected)}, "
            f"got {fmt(mask)}."
        )
    past = torch.nonzero(~mask & expected)
    i, j = past[0].tolist()
    raise ExerciseFailure(
        f"row {i} cannot attend to position {j}, which is in its past (T={T}); only the future is "
        f"masked. Expected {fmt(expected)}, got {fmt(mask)}."
    )


_NOT_BOOL_HINT = (
    ": the book's masks are torch.bool (True = may attend), and the library rejects other dtypes. If it is an "
    "additive mask (0 where allowed, a large negative number where masked), return the boolean mask instead: "
    "the attention function does the filling. Otherwise convert with .bool() or build it with dtype=torch.bool"
)


@check("check_causal_mask")
def check_causal_mask(fn: Callable[[int], Tensor]) -> None:
    """Chapter "Masking", exercise 1: check ``fn(T)`` returns a bool ``(T, T)`` tensor, True where query ``i``
    may attend to key ``j <= i``. ``fn`` is given the ints T = 1, 2, 3, 5 and 8."""
    sizes = (1, 2, 3, 5, 8)
    masks = {}
    for T in sizes:
        where = f"for T={T}"
        mask = require_tensor(fn(T), where, (T, T), torch.bool, what="the mask", dtype_hint=_NOT_BOOL_HINT)
        masks[T] = mask.detach().cpu()
    if all(torch.equal(masks[T], ~causal_mask(T)) for T in sizes if T > 1):
        T = 3
        raise ExerciseFailure(
            f"your mask is the exact opposite of the causal mask: True where attending is forbidden. In this "
            f"book True means 'may attend' (as in torch.nn.functional.scaled_dot_product_attention), so row t "
            f"is True at positions 0..t. For T={T}: expected {fmt(causal_mask(T))}, got {fmt(masks[T])}."
        )
    for T in sizes:
        _diagnose_causal(masks[T], T)


def _cases() -> list[tuple[str, Tensor, Tensor]]:
    """(description, scores, mask) test cases, from the simplest to the edge cases."""
    g = torch.Generator().manual_seed(4)
    cases = []
    # 0. nothing masked, T_q != T_k so a softmax over the wrong axis shows
    cases.append(("3 queries x 4 keys, nothing masked", torch.randn(3, 4, generator=g), torch.ones(3, 4, dtype=bool)))
    # 1. a causal mask
    cases.append(("a causal mask, T=4", 2 * torch.randn(4, 4, generator=g), causal_mask(4)))
    # 2. padding + causal, broadcast over heads: (B, h, T, T) scores with a (B, 1, T, T) mask
    mask = combine_masks(padding_mask([5, 3], 5), causal=True)
    cases.append(
        ("padding + causal, scores (2, 3, 5, 5), mask (2, 1, 5, 5)", torch.randn(2, 3, 5, 5, generator=g), mask)
    )
    # 3. float64
    cases.append(
        ("float64 scores with a causal mask, T=3", torch.randn(3, 3, generator=g, dtype=torch.float64), causal_mask(3))
    )
    # 4. T = 1
    cases.append(("a single query and key (T=1)", torch.randn(1, 1, generator=g), torch.ones(1, 1, dtype=bool)))
    # 5. all-masked query rows: row 0 has no key it may attend to
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, False], [False, False, False]])
    cases.append(("a mask whose rows 0 and 3 allow no key at all", torch.randn(4, 3, generator=g), mask))
    return cases


def _first_row(bad: Tensor) -> tuple[int, ...]:
    """Index (without the last axis) of the first True in a bool tensor of shape (..., T_q)."""
    return tuple(torch.nonzero(bad)[0].tolist())


@check("check_masked_softmax")
def check_masked_softmax(fn: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Chapter "Masking", exercise 2: check ``fn(scores, mask)``: softmax over the keys ignoring masked keys.

    ``fn`` is given ``scores (..., T_q, T_k)`` (float32 or float64, with no or two leading axes)
    and a bool ``mask`` that broadcasts to them (True = may attend), and must return weights of
    the scores' shape and dtype, with rows of zeros where a query has no allowed key. Its gradient
    must stay finite on such rows.
    """
    for desc, scores, mask in _cases():
        where = f"for {desc}"
        w = call_student(fn, (scores, mask), where)
        require_tensor(w, where, scores.shape, scores.dtype, what="the weights")
        _diagnose_weights(desc, scores, mask, w.detach())
    _check_gradient(fn)


def _diagnose_weights(desc: str, scores: Tensor, mask: Tensor, w: Tensor) -> None:
    """Raise ExerciseFailure naming the first problem of weights ``w`` with the scores' shape."""
    expected = masked_softmax(scores, mask)
    empty = ~mask.expand(scores.shape).any(-1)  # (..., T_q): rows with no allowed key
    if torch.isnan(w).any():
        row = _first_row(torch.isnan(w).any(-1))
        if bool(empty[row]):
            raise ExerciseFailure(
                f"for {desc}, row {row[-1]} has every key masked and your weights there are NaN: with -inf "
                f"in every score, softmax computes 0/0. Return a row of zeros for such queries. "
                f"Got {fmt(w[row])}, expected {fmt(expected[row])}."
            )
        raise ExerciseFailure(f"for {desc}, your weights contain NaN in row {row[-1]}: {fmt(w[row])}.")
    leak = (w.abs() > 1e-6) & ~mask.expand(scores.shape)
    if leak.any():
        idx = tuple(torch.nonzero(leak)[0].tolist())
        row = idx[:-1]
        if bool(empty[row]) and close(w[row], torch.full_like(w[row], 1.0 / scores.shape[-1])):
            raise ExerciseFailure(
                f"for {desc}, row {row[-1]} has every key masked and your weights there are uniform "
                f"({fmt(w[row])}): when every score is the same fill value, softmax spreads the weight "
                f"evenly over keys that are all masked. Return zeros for rows with no allowed key."
            )
        raise ExerciseFailure(
            f"for {desc}, key {idx[-1]} is masked in row {row[-1]} but gets weight {w[idx].item():.4f} "
            f"(expected 0). The fill value must be a large negative number (such as -1e9 or "
            f"torch.finfo(dtype).min), not a tiny one like -1e-9 or 0, and it goes in before the softmax. "
            f"Row {row[-1]}: got {fmt(w[row])}, expected {fmt(expected[row])}."
        )
    sums = w.sum(-1)
    expected_sums = (~empty).to(w.dtype)
    if not close(sums, expected_sums, atol=1e-4):
        col_sums = w.sum(-2)
        if not empty.any() and close(col_sums, torch.ones_like(col_sums), atol=1e-4):
            raise ExerciseFailure(
                f"for {desc}, your weights sum to 1 down each column (over the queries, dim=-2) instead of "
                f"along each row (over the keys, dim=-1). Each query needs its own distribution over the "
                f"keys: use softmax(..., dim=-1). Got {fmt(w)}."
            )
        row = _first_row((sums - expected_sums).abs() > 1e-4)
        if bool(empty[row]):
            raise ExerciseFailure(
                f"for {desc}, row {row[-1]} has no allowed key and should be all zeros; got {fmt(w[row])}."
            )
        raise ExerciseFailure(
            f"for {desc}, row {row[-1]} of your weights sums to {sums[row].item():.4f}, not 1. Zeroing the "
            f"masked weights after the softmax leaves the rest unnormalised (and their normaliser still "
            f"depends on the masked scores): mask the scores before the softmax instead. "
            f"Got {fmt(w[row])}, expected {fmt(expected[row])}."
        )
    if not close(w, expected):
        row = _first_row(~torch.isclose(w.double(), expected.double(), atol=1e-5, rtol=1e-4).all(-1))
        raise ExerciseFailure(
            f"for {desc}, row {row[-1]} of your weights is {fmt(w[row])}; expected {fmt(expected[row])}."
        )


def _check_gradient(fn: Callable[[Tensor, Tensor], Tensor]) -> None:
    """A row with no allowed key must not send NaN backwards to the scores."""
    desc, scores, mask = _cases()[-1]
    scores = scores.clone().requires_grad_(True)
    w = fn(scores * 1.0, mask.clone())  # a non-leaf copy, so in-place edits inside fn are allowed
    g = torch.Generator().manual_seed(5)
    (w * torch.randn(w.shape, generator=g)).sum().backward()
    if scores.grad is None or not torch.isfinite(scores.grad).all():
        rows = [] if scores.grad is None else torch.nonzero(~torch.isfinite(scores.grad).all(-1)).flatten().tolist()
        raise ExerciseFailure(
            f"for {desc}, the weights are right, but the gradient with respect to the scores is NaN in rows "
            f"{rows}. A NaN made in the forward pass (softmax of a row of -inf) flows backwards even when "
            f"torch.where replaces it by 0 afterwards: fill the masked scores with a finite value such as "
            f"torch.finfo(scores.dtype).min (using masked_fill, not by adding -inf), then zero the empty rows."
        )
