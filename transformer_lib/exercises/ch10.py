"""Checks for chapter 10 ("Attention at scale"): one step of attention with a key-value cache, and
the online-softmax merge of two blocks of keys.

- :func:`check_cached_attention` for ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_all, v_all)``
  (exercise ex-10-1);
- :func:`check_softmax_merge` for ``fn(m1, l1, o1, m2, l2, o2) -> (m, l, o)`` (exercise ex-10-2).

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._core import ExerciseFailure, call_student, check, close, fmt, require_finite, require_tensor, require_tensors

__all__ = [
    "check_cached_attention",
    "check_softmax_merge",
    "reference_cached_attention",
    "reference_softmax_merge",
    "softmax_block_stats",
]


# ---------------------------------------------------------------- check_cached_attention


def reference_cached_attention(
    q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One step of causal attention with a key-value cache (chapter 10, exercise 10.1).

    ``q, k_new, v_new (B, h, T_new, d_k)`` belong to the new tokens, ``k_cache, v_cache
    (B, h, T_cached, d_k)`` to the tokens before them (``T_cached`` may be 0). Returns ``out
    (B, h, T_new, d_k)`` and the grown cache ``k_all, v_all (B, h, T_cached + T_new, d_k)``. New
    token ``i`` sits at position ``T_cached + i`` and attends to every key up to its own position.
    """
    k_all = torch.cat([k_cache, k_new], dim=-2)  # (B, h, T_k, d_k)
    v_all = torch.cat([v_cache, v_new], dim=-2)
    T_cached, T_new = k_cache.shape[-2], q.shape[-2]
    # (T_new, T_k), True = may attend; aligned to the end of the keys
    keep = torch.arange(T_cached + T_new)[None, :] <= T_cached + torch.arange(T_new)[:, None]
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=keep), k_all, v_all


def _cache_cases() -> list[tuple[str, tuple[Tensor, ...]]]:
    """(description, (q, k_new, v_new, k_cache, v_cache)) from a single new token to a prefill."""
    g = torch.Generator().manual_seed(10)
    cases = []
    for B, h, T_cached, T_new, d_k, dtype in (
        (1, 1, 3, 1, 4, torch.float32),
        (2, 2, 5, 1, 8, torch.float32),
        (1, 2, 4, 3, 4, torch.float32),
        (2, 1, 0, 4, 4, torch.float32),
        (1, 1, 0, 1, 2, torch.float32),
        (2, 3, 6, 2, 8, torch.float64),
    ):
        new = [torch.randn(B, h, T_new, d_k, generator=g, dtype=dtype) for _ in range(3)]
        old = [torch.randn(B, h, T_cached, d_k, generator=g, dtype=dtype) for _ in range(2)]
        kind = "a prefill (empty cache)" if T_cached == 0 else f"{T_new} new token{'s' * (T_new > 1)}"
        desc = (
            f"B={B}, h={h}, d_k={d_k}, T_cached={T_cached}, T_new={T_new} ({kind}"
            f"{', float64' if dtype == torch.float64 else ''})"
        )
        cases.append((desc, (*new, *old)))
    return cases


def _cat_hint(exc: Exception) -> str | None:
    """The hint for the crash of joining the cache and the new entries along the wrong axis."""
    if isinstance(exc, RuntimeError) and "Sizes of tensors must match" in str(exc):
        return "Append the new keys and values along the sequence axis (dim=-2), where the sizes may differ."
    return None


def _cache_hint(args: tuple[Tensor, ...], out: Tensor) -> str:
    """Name the likely slip behind a wrong attention output."""
    q, k_new, v_new, k_cache, v_cache = args
    T_cached, T_new, d_k = k_cache.shape[-2], q.shape[-2], q.shape[-1]
    k_all, v_all = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    if T_cached > 0 and close(out, F.scaled_dot_product_attention(q, k_cache, v_cache)):
        return (
            "your queries attended to the cached keys only. Append the new keys and values first, then "
            "attend: each new token must also see itself (and the new tokens before it)"
        )
    if T_cached > 0 and close(out, F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)):
        return (
            "your causal mask is aligned to the top left (as is_causal=True does when T_q != T_k), so new "
            "token i sees only keys 0..i. New token i sits at position T_cached + i: it may attend to keys "
            "0..T_cached + i, a mask aligned to the end of the keys"
        )
    if T_new > 1 and close(out, F.scaled_dot_product_attention(q, k_all, v_all)):
        return (
            "your new tokens attend to each other without a causal mask: new token i must not see the new "
            "tokens after it (keys beyond position T_cached + i)"
        )
    keep = torch.arange(T_cached + T_new)[None, :] <= T_cached + torch.arange(T_new)[:, None]
    if close(out, F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=keep, scale=1.0)):
        return "the scores are not divided by sqrt(d_k)"
    if close(out, F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=keep, scale=1.0 / d_k)):
        return "you divided the scores by d_k; divide by sqrt(d_k)"
    return "out[..., i, :] must be causal attention of query i over every key up to position T_cached + i"


@check("check_cached_attention")
def check_cached_attention(fn: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    """Chapter 10, exercise 10.1: check ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_all, v_all)``.

    ``fn`` is given ``q, k_new, v_new (B, h, T_new, d_k)`` and ``k_cache, v_cache (B, h, T_cached,
    d_k)`` (``T_cached`` from 0; float32 and float64) and must return the attention output
    ``(B, h, T_new, d_k)`` and the grown cache ``(B, h, T_cached + T_new, d_k)``, as
    :func:`reference_cached_attention`. Finally it decodes a sequence token by token through
    ``fn`` and compares with causal attention over the whole sequence.
    """
    names = ("out", "k_all", "v_all")
    for desc, args in _cache_cases():
        where = f"for {desc}"
        got = call_student(
            fn, args, where, crash_hint=_cat_hint, inputs="the tensors it was given (the cache)",
            in_place_hint="build the grown cache with torch.cat, which makes a new tensor",
        )  # fmt: skip
        out, k_all, v_all = require_tensors(got, where, names)
        want_out, want_k, want_v = reference_cached_attention(*args)
        for name, value, want in (("k_all", k_all, want_k), ("v_all", v_all, want_v)):
            require_tensor(
                value, where, want.shape, want.dtype, what=name, layout="(B, h, T_cached + T_new, d_k)",
                shape_hint=": append the new keys and values along the sequence axis (dim=-2)",
            )  # fmt: skip
            if not torch.equal(value, want):
                new, old = (args[1], args[3]) if name == "k_all" else (args[2], args[4])
                if torch.equal(value, torch.cat([new, old], dim=-2)):
                    hint = "you put the new entries before the cached ones; the cache keeps positions in order, "
                    hint += "old ones first, the new ones appended at the end"
                else:
                    hint = f"{name} must be the cache followed by the new entries, torch.cat([cache, new], dim=-2)"
                raise ExerciseFailure(f"{where}, {name} is wrong: {hint}.")
        require_tensor(out, where, want_out.shape, want_out.dtype, what="out", layout="(B, h, T_new, d_k)")
        require_finite(out, where, what="out", hint=" (a query must always see at least its own key)")
        if not close(out, want_out, atol=1e-5 if out.dtype == torch.float32 else 1e-10):
            raise ExerciseFailure(
                f"{where}, out is wrong: {_cache_hint(args, out.detach())}. Largest difference "
                f"{(out.detach() - want_out).abs().max().item():.3g}."
            )
    _check_token_by_token(fn)


def _check_token_by_token(fn: Callable) -> None:
    """Decode six tokens one at a time through ``fn``: the outputs must equal full causal attention."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, 2, 6, 4)
    k_cache = v_cache = torch.zeros(1, 2, 0, 4, dtype=torch.float64)
    where = "decoding 6 tokens one at a time from an empty cache"
    for t in range(6):
        step = slice(t, t + 1)
        out, k_cache, v_cache = require_tensors(
            call_student(fn, (q[..., step, :], k[..., step, :], v[..., step, :], k_cache, v_cache), where),
            where,
            ("out", "k_all", "v_all"),
        )
        if not close(out, full[..., step, :], atol=1e-10):
            raise ExerciseFailure(
                f"{where}, the output at token {t} differs from causal attention over the whole sequence: "
                f"expected {fmt(full[0, 0, t])}, got {fmt(out.detach()[0, 0, 0])}."
            )


# ---------------------------------------------------------------- check_softmax_merge


def softmax_block_stats(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One block's online-softmax statistics (chapter 10, exercise 10.2).

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
    """The statistics ``(m, l, o)`` of two blocks of keys together, from each block's (chapter 10).

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
        ("one query, scores [1.0, 0.5 | 3.0, 2.0] (the second block has the larger maximum)",
         torch.tensor([[1.0, 0.5, 3.0, 2.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]]), 2),
        ("one query, scores [4.0, 1.0 | 0.0, -2.0] (the first block has the larger maximum)",
         torch.tensor([[4.0, 1.0, 0.0, -2.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 3.0]]), 2),
        ("3 queries, 5 + 3 random keys, d = 4", torch.randn(3, 8, generator=g), torch.randn(8, 4, generator=g), 5),
        ("2 queries, blocks of 1 and 6 keys, float64", torch.randn(2, 7, generator=g, dtype=torch.float64),
         torch.randn(7, 3, generator=g, dtype=torch.float64), 1),
        ("2 queries with scores near 1000 (exp(1000) overflows)", 1000 + torch.randn(2, 6, generator=g),
         torch.randn(6, 3, generator=g), 3),
        ("2 queries whose second block is fully masked (scores -inf: m2 = -inf, l2 = 0, o2 = 0)",
         torch.cat([torch.randn(2, 3, generator=g), torch.full((2, 2), float("-inf"))], -1),
         torch.randn(5, 3, generator=g), 3),
    ]  # fmt: skip
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
    """Chapter 10, exercise 10.2: check ``fn(m1, l1, o1, m2, l2, o2) -> (m, l, o)``, two blocks merged.

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
                value, where, what=name,
                hint=": exp of a large score overflows, so work only with differences such as m1 - m, which are "
                "never positive (and exp(-inf) = 0 for a fully masked block)",
            )  # fmt: skip
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
