"""Checks for chapter "Multi-head attention".

- :func:`check_mha_param_count` for ``fn(d_model, n_heads, bias=True) -> int`` (exercise ex-05-1);
- :func:`check_split_heads` for ``fn(x (B, T, d_model), n_heads) -> (B, h, T, d_k)`` and
  :func:`check_merge_heads` for ``fn(x (B, h, T, d_k)) -> (B, T, h * d_k)`` (exercise ex-05-2);
- :func:`check_head_contributions` for ``fn(mha, x) -> (B, h, T, d_model)`` (exercise ex-05-3).
"""

from __future__ import annotations

import torch

from ..attention import scaled_dot_product_attention
from ..cost import multihead_cost
from ..multihead import MultiHeadAttention, head_contributions, merge_heads, split_heads
from ._core import ExerciseFailure, call_student, check, close, fmt, require_int, require_tensor

__all__ = ["check_head_contributions", "check_merge_heads", "check_mha_param_count", "check_split_heads"]


def _labelled(B: int, T: int, d_model: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``(B, T, d_model)`` tensor whose entry ``[b, t, c]`` is ``1000 b + 100 t + c`` (unique for small sizes)."""
    b = torch.arange(B, dtype=dtype)[:, None, None]
    t = torch.arange(T, dtype=dtype)[None, :, None]
    c = torch.arange(d_model, dtype=dtype)[None, None, :]
    return 1000 * b + 100 * t + c  # unique as long as d_model <= 100 and T <= 10


# --------------------------------------------------------------------------- ex-05-1


@check("check_mha_param_count")
def check_mha_param_count(fn) -> None:
    """Chapter "Multi-head attention", exercise 1: ``fn(d_model, n_heads, bias=True)`` must return the parameter count
    of multi-head attention as an int. ``fn`` is given ints only, from ``(4, 1)`` up to ``(512, 8)``."""
    cases = [(4, 1, True), (4, 2, True), (4, 2, False), (6, 3, True), (8, 8, False), (512, 8, True)]
    for d_model, h, bias in cases:
        call = f"mha_param_count({d_model}, {h}, bias={bias})"
        got_int = require_int(fn(d_model, h, bias=bias), call)
        want = multihead_cost(d_model, h, T_q=1, bias=bias)["params"]
        if got_int == want:
            continue
        d = d_model
        biases = 4 * d if bias else 0
        hints = {
            4 * h * d * d + h * biases: "you gave every head full d_model x d_model projections; each head "
            "projects to only d_k = d_model / h features, so together the h heads need d_model x d_model "
            "weights per projection, whatever h is.",
            3 * h * d * d + 3 * h * (d if bias else 0) + d * d + (d if bias else 0): "you gave every head full "
            "d_model x d_model projections for Q, K and V; each head's slice is only d_k = d_model / h wide.",
            3 * d * d + (3 * d if bias else 0): "you left out the output projection W_o (d_model x d_model, "
            "plus its bias).",
            4 * d * d: "you left out the four bias vectors (d_model each) that nn.Linear adds when bias=True.",
            4 * d * d + 4 * d: "with bias=False the four projections have no bias vectors.",
            4 * d * (d // h) + (4 * (d // h) if bias else 0): "you counted a single head's d_k = d_model / h "
            "wide projections; the h heads together project to d_model features.",
        }
        hint = hints.get(got_int, "count the weights and biases of the four projections W_q, W_k, W_v and W_o.")
        raise ExerciseFailure(f"{call}: the count is {want}, you returned {got_int}: {hint}")


# --------------------------------------------------------------------------- ex-05-2

_SPLIT_CASES = [(1, 1, 4, 2), (1, 3, 4, 2), (2, 3, 6, 3), (1, 2, 4, 1), (1, 2, 4, 4), (2, 5, 12, 4)]


def _split_diagnosis(x: torch.Tensor, h: int, got: torch.Tensor) -> str:
    B, T, d_model = x.shape
    d_k = d_model // h
    if close(got, x.reshape(B, h, T, d_k)):
        return (
            "you reshaped straight to (B, h, T, d_k). That cuts each sequence's flattened (T, d_model) "
            "block into h consecutive chunks, so a 'head' receives whole positions instead of its own d_k "
            "features of every position. Reshape to (B, T, h, d_k) first, then swap the T and h axes."
        )
    if close(got, x.reshape(B, T, d_k, h).permute(0, 3, 1, 2)):
        return (
            "head i should get the contiguous features i*d_k, ..., (i+1)*d_k - 1 of every position, but "
            "it got every h-th feature (i, i+h, i+2h, ...): split the last axis as (h, d_k), not (d_k, h)."
        )
    return "compare head 0 with x[:, :, :d_k]: it should be exactly those features, position by position."


@check("check_split_heads")
def check_split_heads(fn) -> None:
    """Chapter "Multi-head attention", exercise 2: ``fn(x, n_heads)`` must turn ``x (B, T, d_model)`` into ``(B, h, T,
    d_k)`` like :func:`split_heads`. ``fn`` is given labelled float32 and float64 inputs, from ``(1, 1, 4)`` up."""
    for dtype in (torch.float32, torch.float64):
        for B, T, d_model, h in _SPLIT_CASES:
            x = _labelled(B, T, d_model, dtype)
            where = f"for x of shape {tuple(x.shape)} (entry [b, t, c] = 1000 b + 100 t + c) and n_heads={h}"
            want = split_heads(x, h)
            got = require_tensor(call_student(fn, (x, h), where), where, want.shape, x.dtype, layout="(B, h, T, d_k)")
            if not close(got, want, atol=0, rtol=0):
                bad = (got != want).nonzero()[0].tolist()
                b, i, t = bad[0], bad[1], bad[2]
                raise ExerciseFailure(
                    f"{where}: {_split_diagnosis(x, h, got)} For example head {i} at position {t} of "
                    f"sequence {b} should be {fmt(want[b, i, t])}, got {fmt(got[b, i, t])}."
                )


def _view_hint(exc: Exception) -> str | None:
    """The hint for ``.view`` after a transpose, the classic crash of merging heads."""
    if isinstance(exc, RuntimeError) and "view" in str(exc):
        return (
            "After a transpose the tensor is no longer contiguous in memory, so .view cannot regroup it; use "
            ".reshape (or .contiguous().view)."
        )
    return None


def _merge_hint(x: torch.Tensor, got: torch.Tensor) -> str:
    """Name the likely slip behind merged heads with the right shape but wrong values."""
    B, h, T, d_k = x.shape
    if close(got, x.reshape(B, T, h * d_k)):
        return (
            "you reshaped (B, h, T, d_k) straight to (B, T, h * d_k), which glues positions of "
            "one head together instead of the heads of one position. Swap the h and T axes first."
        )
    if close(got, x.permute(0, 2, 3, 1).reshape(B, T, h * d_k)):
        return (
            "you interleaved the heads' features (feature 0 of every head, then feature 1, ...); "
            "the heads must sit side by side: head 0's d_k features, then head 1's, and so on."
        )
    return "merging must undo split_heads exactly."


@check("check_merge_heads")
def check_merge_heads(fn) -> None:
    """Chapter "Multi-head attention", exercise 2: ``fn(x)`` must turn ``x (B, h, T, d_k)`` into ``(B, T, h * d_k)``
    like
    :func:`merge_heads`. ``fn`` is given split labelled float32 and float64 inputs, made contiguous."""
    for dtype in (torch.float32, torch.float64):
        for B, T, d_model, h in _SPLIT_CASES:
            x = split_heads(_labelled(B, T, d_model, dtype), h).contiguous()  # (B, h, T, d_k), as attention makes it
            where = (
                f"for heads of shape {tuple(x.shape)} (B, h, T, d_k), made by splitting a labelled (B, T, d_model) x"
            )
            want = merge_heads(x)
            got = call_student(fn, (x,), where, crash_hint=_view_hint)
            require_tensor(got, where, want.shape, x.dtype, layout="(B, T, h * d_k)")
            if not close(got, want, atol=0, rtol=0):
                bad = (got != want).nonzero()[0].tolist()
                b, t = bad[0], bad[1]
                raise ExerciseFailure(
                    f"{where} (d_k={d_model // h}): {_merge_hint(x, got)} Position {t} of sequence {b} should be "
                    f"{fmt(want[b, t])}, got {fmt(got[b, t])}."
                )


# --------------------------------------------------------------------------- ex-05-3


@check("check_head_contributions")
def check_head_contributions(fn) -> None:
    """Chapter "Multi-head attention", exercise 3: ``fn(mha, x)`` must return each head's share ``(B, h, T, d_model)``
    of ``mha(x, x, x)``. ``fn`` is given a :class:`MultiHeadAttention` in eval mode and ``x (B, T, d_model)``."""
    cases = [(4, 2, 1, 1, True), (4, 2, 1, 3, True), (6, 3, 2, 4, False), (4, 1, 1, 2, True), (8, 8, 2, 5, True)]
    gen = torch.Generator().manual_seed(5)
    for d_model, h, B, T, bias in cases:
        torch.manual_seed(d_model * 100 + h * 10 + T)
        mha = MultiHeadAttention(d_model, h, bias=bias).eval()
        if bias:
            with torch.no_grad():
                mha.out_proj.bias.normal_(generator=gen)  # a visible bias, so adding it shows
        x = torch.randn(B, T, d_model, generator=gen)
        where = f"for MultiHeadAttention({d_model}, {h}, bias={bias}) and x of shape {tuple(x.shape)}"
        got = call_student(fn, (mha, x), where)
        with torch.no_grad():
            want = head_contributions(mha, x, x, x)
            out, _ = mha(x, x, x)
        heads_only = isinstance(got, torch.Tensor) and got.shape == (B, h, T, d_model // h) and h > 1
        extra = ". That is the heads' outputs themselves; pass each one through its part of W_o" if heads_only else ""
        require_tensor(got, where, want.shape, layout="(B, h, T, d_model)", shape_hint=extra)
        if close(got, want):
            continue
        got = got.detach()
        b_o = mha.out_proj.bias if bias else torch.zeros(d_model)
        if bias and close(got - b_o, want):
            hint = (
                "each of your contributions includes out_proj.bias, so their sum counts the bias h times; "
                "leave the bias out (the sum over heads plus the bias once is the output)."
            )
        elif bias and close(got - b_o / h, want):
            hint = (
                "your contributions include a share bias / h each; the bias belongs to no head, so leave it "
                "out of every contribution."
            )
        elif close(got.sum(1) + b_o, out):
            hint = "the sum over heads is right, but the split between heads is not: head i owns columns "
            hint += "i*d_k to (i+1)*d_k - 1 of out_proj.weight."
        else:
            W = mha.out_proj.weight.detach()
            d_k = d_model // h
            with torch.no_grad():
                q, k, v = (split_heads(p(x), h) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
                heads, _ = scaled_dot_product_attention(q, k, v)  # (B, h, T, d_k)
            rows = torch.stack([heads[:, i] @ W[i * d_k : (i + 1) * d_k, :] for i in range(h)], 1)
            if close(got, rows):
                hint = (
                    "you multiplied head i by rows i*d_k to (i+1)*d_k - 1 of out_proj.weight; nn.Linear "
                    "computes x @ W.T, so head i meets columns i*d_k to (i+1)*d_k - 1 of W."
                )
            else:
                hint = "the contributions summed over heads, plus out_proj.bias, must equal mha(x, x, x)[0]."
        err = (got - want).abs().amax().item()
        raise ExerciseFailure(f"{where}: {hint} (largest difference {err:.3g})")
