"""Checks for chapter "Latent, sparse and sink attention": the softmax with a
sink, and the key up-projection folded into the query.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._core import ExerciseFailure, call_student, check, close, fmt, require_finite, require_tensor

__all__ = ["check_fold_query", "check_sink_softmax"]


def _sink_softmax(scores: Tensor, sink: Tensor) -> Tensor:
    column = sink[:, None, None].expand(*scores.shape[:-1], 1)  # (..., h, T_q, 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def _first_mistake(wrong: dict[str, Tensor], actual: Tensor, right: Tensor) -> str | None:
    for mistake, w in wrong.items():
        if w.shape == actual.shape and close(actual, w, atol=1e-6) and not close(w, right, atol=1e-6):
            return mistake
    return None


@check("check_sink_softmax")
def check_sink_softmax(fn: Callable) -> None:
    """Chapter "Latent, sparse and sink attention", exercise 1: check ``fn(scores (..., h, T_q, T_k), sink (h,)) ->
    (..., h, T_q, T_k)``.

    ``fn`` is given a row of scores per query and one sink logit per head; it returns the softmax
    of each row with one more column, the head's sink logit, which is then dropped: the weights of
    the keys sum to less than 1. Compared with the formula on small logits, large ones (where
    ``exp`` overflows unless the row's maximum is subtracted first), a batch of heads and float64.
    """
    g = torch.Generator().manual_seed(16)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    f64 = torch.float64
    cases = [
        ("scores of shape (h, T_q, T_k) = (2, 3, 4)", r(2, 3, 4), r(2)),
        ("scores of shape (B, h, T_q, T_k) = (2, 3, 4, 5)", r(2, 3, 4, 5), r(3)),
        ("large scores (about 1000) and sinks", r(2, 3, 3) + 1000, torch.tensor([1000.5, 999.0])),
        ("float64 scores of shape (3, 2, 6)", r(3, 2, 6, dtype=f64), r(3, dtype=f64)),
    ]
    for desc, scores, sink in cases:
        where = f"for {desc}"
        out = call_student(fn, (scores.clone(), sink.clone()), where, inputs="scores or sink", crash_hint=None)
        require_tensor(
            out, where, tuple(scores.shape), what="the result", layout="(..., h, T_q, T_k), the scores' shape"
        )
        require_finite(out, where, hint="; subtract each row's maximum (the sink included) before exp")
        right = _sink_softmax(scores, sink)
        if out.dtype != scores.dtype:
            raise ExerciseFailure(f"{where}, the result has dtype {out.dtype}; keep the scores' dtype {scores.dtype}.")
        if not close(out, right, atol=1e-6, rtol=1e-5):
            h = sink.shape[0]
            wrong = {
                "you renormalised after dropping the sink (or left it out): each row then sums to 1, and the "
                "sink takes no attention": torch.softmax(scores, dim=-1),
                "the sink is one logit per head: index it by the head axis (-3), not by the query axis": (
                    _sink_softmax(scores, sink[:1].expand(h)) if h > 1 else right
                ),
            }
            mistake = _first_mistake(wrong, out, right)
            detail = f"expected {fmt(right)}, got {fmt(out)}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")


@check("check_fold_query")
def check_fold_query(fn: Callable) -> None:
    """Chapter "Latent, sparse and sink attention", exercise 2: check ``fn(q_nope (B, h, T_q, d_nope), w_uk (h, d_nope,
    d_c)) -> (B, h, T_q, d_c)``.

    ``fn`` is given each head's queries and key up-projection. Head ``i`` rebuilds its keys from
    the latent ``c (d_c,)`` as ``w_uk[i] @ c``; its query ``q`` scores them by ``q . (w_uk[i] @ c)
    = (w_uk[i]^T q) . c``. The function returns the folded queries ``w_uk[i]^T q`` of every head,
    which score the latents directly. Compared with the formula on square and non-square matrices
    and float64.
    """
    g = torch.Generator().manual_seed(161)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    cases = [
        ("q_nope (1, 2, 3, 4) and w_uk (2, 4, 6)", r(1, 2, 3, 4), r(2, 4, 6)),
        ("square w_uk (3, 5, 5), q_nope (2, 3, 4, 5)", r(2, 3, 4, 5), r(3, 5, 5)),
        (
            "float64 q_nope (2, 4, 1, 3) and w_uk (4, 3, 8)",
            r(2, 4, 1, 3, dtype=torch.float64),
            r(4, 3, 8, dtype=torch.float64),
        ),
    ]
    for desc, q, w in cases:
        where = f"for {desc}"
        hint = "the folded query is the transpose w_uk[i]^T times q: a sum over d_nope, the middle axis of w_uk"
        out = call_student(fn, (q.clone(), w.clone()), where, inputs="q_nope or w_uk", crash_hint=hint)
        B, h, T, _ = q.shape
        require_tensor(out, where, (B, h, T, w.shape[-1]), what="the result", layout="(B, h, T_q, d_c)")
        right = torch.einsum("bhtn,hnc->bhtc", q, w)
        if not close(out, right, atol=1e-5, rtol=1e-4):
            wrong = {
                "you multiplied by w_uk[i] where its transpose belongs: the folded query is w_uk[i]^T q, "
                "so sum over d_nope": torch.einsum("bhtn,hcn->bhtc", q, w) if w.shape[1] == w.shape[2] else right,
                "you summed over the heads: each head folds its own matrix": torch.einsum("bhtn,gnc->bhtc", q, w),
                "you used head 0's matrix for every head": torch.einsum("bhtn,nc->bhtc", q, w[0]),
            }
            mistake = _first_mistake(wrong, out, right)
            detail = f"expected {fmt(right)}, got {fmt(out)}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")
