"""Checks for chapter "Generation": one step of attention with a key-value cache.

- :func:`check_cached_attention` for ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_all, v_all)``
  (exercise ex-10-1);
- :func:`check_top_p_filter` for ``fn(logits, p) -> logits`` with every token outside the nucleus
  at ``-inf`` (exercise ex-10-3).

The online-softmax merge of two blocks of keys moved with its section to chapter "Long context and precision"
(:mod:`transformer_lib.exercises.long_context_and_precision`).

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..sampling import top_p_filter
from ._core import ExerciseFailure, call_student, check, close, fmt, require_finite, require_tensor, require_tensors

__all__ = ["check_cached_attention", "check_top_p_filter", "reference_cached_attention"]


# ---------------------------------------------------------------- check_cached_attention


def reference_cached_attention(
    q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One step of causal attention with a key-value cache (chapter "Generation", exercise 1).

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
    """Chapter "Generation", exercise 1: check ``fn(q, k_new, v_new, k_cache, v_cache) -> (out, k_all, v_all)``.

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
            fn,
            args,
            where,
            crash_hint=_cat_hint,
            inputs="the tensors it was given (the cache)",
            in_place_hint="build the grown cache with torch.cat, which makes a new tensor",
        )
        out, k_all, v_all = require_tensors(got, where, names)
        want_out, want_k, want_v = reference_cached_attention(*args)
        for name, value, want in (("k_all", k_all, want_k), ("v_all", v_all, want_v)):
            require_tensor(
                value,
                where,
                want.shape,
                want.dtype,
                what=name,
                layout="(B, h, T_cached + T_new, d_k)",
                shape_hint=": append the new keys and values along the sequence axis (dim=-2)",
            )
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


# ---------------------------------------------------------------- check_top_p_filter


def _top_p_cases() -> list[tuple[str, Tensor, float]]:
    """(description, logits, p): from one sure token to a flat row, ties, batches and float64."""
    g = torch.Generator().manual_seed(12)
    sure = torch.tensor([4.0, 1.0, 0.5, 0.0, -1.0])  # the top token alone holds 0.9 of the mass
    spread = torch.tensor([1.0, 2.0, 0.2, 1.5, -0.5, 0.7])
    return [
        ("one row of 5 logits whose top token alone holds more than p = 0.5", sure, 0.5),
        ("one row of 6 logits, p = 0.8", spread, 0.8),
        ("one row of 6 logits, p = 0.3", spread, 0.3),
        ("a batch (2, 3, 7) of random logits, p = 0.9", torch.randn(2, 3, 7, generator=g), 0.9),
        ("a batch (4, 10) of float64 logits, p = 0.6", torch.randn(4, 10, generator=g, dtype=torch.float64), 0.6),
        ("one row of 1 logit, p = 0.5", torch.tensor([[0.3]]), 0.5),
        ("one row [30, 0, -5, -10, -20], p = 1", torch.tensor([30.0, 0.0, -5.0, -10.0, -20.0]), 1.0),
        ("one row [2, 1, 1, 0] with two tied tokens, p = 0.6", torch.tensor([2.0, 1.0, 1.0, 0.0]), 0.6),
    ]


def _keep(logits: Tensor, kept: Tensor) -> Tensor:
    """``logits`` with the tokens outside the boolean ``kept`` at ``-inf``."""
    return logits.masked_fill(~kept, float("-inf"))


def _top_p_hint(logits: Tensor, p: float, got: Tensor, want: Tensor) -> str:
    """Name the likely slip behind a wrong nucleus."""
    kept_want = torch.isfinite(want)
    finite = torch.isfinite(got)
    if bool(finite.all()) and not bool(kept_want.all()) and not torch.equal(got, logits):
        if bool((got >= 0).all()) and bool((got <= 1).all()):
            return "you returned probabilities; return the logits, with -inf for every token outside the nucleus"
        if torch.equal(got[kept_want], logits[kept_want]):
            return (
                "the tokens outside the nucleus must become -inf, not a large negative number or 0: "
                "softmax then gives them exactly zero probability"
            )
    if not bool(finite.any(-1).all()):
        return "a row lost every token; the most likely token is always in the nucleus, whatever p is"
    if p >= 1 and not bool(finite.all()):
        return "p = 1 keeps every token (the whole mass); rounding in a cumulative sum must not drop the last ones"
    order = logits.argsort(dim=-1, descending=True, stable=True)
    if torch.equal(got, logits.gather(-1, order).masked_fill(~torch.isfinite(want.gather(-1, order)), float("-inf"))):
        return "your result is in sorted order; put the kept logits back in the vocabulary's order (scatter)"
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_probs, _ = probs.sort(dim=-1, descending=True)
    sorted_logits = logits.sort(dim=-1, descending=True).values
    # the mass of each token together with every more likely one: keeping it only while <= p
    # (or < p) leaves out the token that crosses p
    cum = sorted_probs.cumsum(-1)
    for inside in (cum <= p, cum < p):
        n = inside.sum(-1, keepdim=True).clamp(min=1)
        if torch.equal(finite, logits >= sorted_logits.gather(-1, n - 1)):
            return (
                "you left out the token that brings the mass to p: the nucleus is the smallest set whose mass "
                "is at least p, so keep a token while the mass of the tokens more likely than it is below p"
            )
    ascending = (probs.sort(dim=-1).values.cumsum(-1) - probs.sort(dim=-1).values) < p
    least = logits.sort(dim=-1).values
    n = ascending.sum(-1, keepdim=True).clamp(min=1)
    if torch.equal(finite, logits <= least.gather(-1, n - 1)):
        return "you kept the least likely tokens; sort the probabilities in descending order"
    raw = sorted_logits.cumsum(-1) - sorted_logits
    n = (raw < p).sum(-1, keepdim=True).clamp(min=1)
    if torch.equal(finite, logits >= sorted_logits.gather(-1, n - 1)) and not torch.equal(finite, kept_want):
        return "you added up logits; the nucleus adds up probabilities, softmax(logits)"
    if torch.equal(kept_want & finite, finite) and bool((kept_want & ~finite).any()):
        lowest = torch.where(kept_want, logits, torch.inf).amin(-1, keepdim=True)
        if bool(((logits == lowest) & kept_want & ~finite).any()):
            return (
                "you dropped a token tied with the least likely member of the nucleus; keep every token whose "
                "logit equals it, so the result does not depend on how the sort orders equal logits"
            )
    return "keep the most likely tokens until their probabilities add up to at least p, and set the rest to -inf"


@check("check_top_p_filter")
def check_top_p_filter(fn: Callable[[Tensor, float], Tensor]) -> None:
    """Chapter "Generation", exercise 3: check ``fn(logits, p) -> logits`` (top-p, nucleus filtering).

    ``fn`` is given ``logits (..., vocab_size)`` (float32 and float64, a single token, a batch)
    and a mass ``p`` in ``(0, 1]``; it must return logits of the same shape and dtype with every
    token outside the nucleus at ``-inf``, as :func:`transformer_lib.top_p_filter`: the nucleus
    is the smallest set of most likely tokens whose probabilities add up to at least ``p``, with
    the tokens tied with its least likely member, and ``p = 1`` keeps every token. It must not
    change ``logits``.
    """
    for desc, logits, p in _top_p_cases():
        where = f"for {desc}"
        got = call_student(
            fn,
            (logits, p),
            where,
            inputs="the logits it was given",
            in_place_hint="use masked_fill (without the underscore), which returns a new tensor",
        )
        want = top_p_filter(logits, p)
        require_tensor(got, where, want.shape, want.dtype, layout="(..., vocab_size)")
        got = got.detach()
        if torch.isnan(got).any():
            raise ExerciseFailure(f"{where}, the result contains NaN ({fmt(got)}).")
        same_kept = torch.equal(torch.isfinite(got), torch.isfinite(want))
        if (
            not same_kept
            or not torch.equal(got[torch.isfinite(want)], want[torch.isfinite(want)])
            or not bool((got[~torch.isfinite(want)] == float("-inf")).all())
        ):
            raise ExerciseFailure(
                f"{where}, the result is wrong: {_top_p_hint(logits, p, got, want)}. Expected {fmt(want)}, got "
                f"{fmt(got)}."
            )
