"""Checks for chapter "The transformer block": the feed-forward network's parameter count and
the two ways of wrapping a sublayer in a residual connection and LayerNorm (pre-LN and post-LN).

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..blocks import FeedForward
from ._core import ExerciseFailure, call_student, check, close, fmt, require_int, require_tensor

__all__ = ["check_ffn_params", "check_post_ln", "check_pre_ln"]


# ---------------------------------------------------------------- check_ffn_params


def _ffn_hint(got: int, d_model: int, d_ff: int, bias: bool) -> str:
    """A sentence naming the likely slip behind a wrong parameter count, or a general hint."""
    weights = 2 * d_model * d_ff
    if bias and got == weights:
        return "That counts the two weight matrices only: with bias=True each linear layer also has a bias vector."
    if not bias and got == weights + d_ff + d_model:
        return "With bias=False the two linear layers have no bias vectors, so only the weights count."
    if bias and got == weights + 2 * d_ff:
        return (
            "The second linear layer maps back to d_model, so its bias has d_model entries, not d_ff "
            "(the first layer's bias has d_ff)."
        )
    if bias and got == weights + 2 * d_model:
        return "The first linear layer maps d_model to d_ff, so its bias has d_ff entries, not d_model."
    if got in (d_model * d_ff, d_model * d_ff + d_ff, d_model * d_ff + d_model, d_model * d_ff + d_ff + d_model):
        return (
            "That looks like one linear layer: the network has two, Linear(d_model, d_ff) and Linear(d_ff, "
            "d_model), with a weight matrix each."
        )
    return "Count the weight matrix and (when bias=True) the bias vector of both linear layers."


@check("check_ffn_params")
def check_ffn_params(fn: Callable[..., int]) -> None:
    """Chapter "The transformer block", exercise 1: check ``fn(d_model, d_ff, bias=True)`` returns, as an int, the
    parameter count of ``tl.FeedForward(d_model, d_ff, bias=bias)``. ``fn`` is given ints only; no tensors."""
    cases = ((2, 3, True), (2, 3, False), (1, 1, True), (4, 16, True), (5, 8, False), (512, 2048, True))
    for d_model, d_ff, bias in cases:
        with torch.device("meta"):  # shapes only: no memory, no random numbers drawn
            expected = sum(p.numel() for p in FeedForward(d_model, d_ff, bias=bias).parameters())
        call = f"ffn_param_count({d_model}, {d_ff}, bias={bias})"
        got = require_int(fn(d_model, d_ff, bias=bias), call, " (a number of parameters)")
        if got != expected:
            raise ExerciseFailure(
                f"{call}: tl.FeedForward has {expected} parameters, your function returned {got}. "
                f"{_ffn_hint(got, d_model, d_ff, bias)}"
            )


# ---------------------------------------------------------------- check_pre_ln / check_post_ln


def _residual_cases() -> list[tuple[str, Tensor, nn.Module, nn.LayerNorm]]:
    """(description, x, sublayer, norm) cases, simplest first.

    The input has a non-zero mean and a scale far from 1, the LayerNorm has random weight and
    bias and the sublayer is non-linear, so that every plausible wrong arrangement gives a
    different answer.
    """
    g = torch.Generator().manual_seed(7)
    cases = []
    with torch.random.fork_rng(devices=[]):  # building the modules must not move the caller's global RNG
        for desc, shape, dtype in (
            ("x of shape (2, 3, 4)", (2, 3, 4), torch.float32),
            ("a single position, x of shape (1, 1, 4)", (1, 1, 4), torch.float32),
            ("float64 x of shape (3, 5, 6)", (3, 5, 6), torch.float64),
        ):
            d = shape[-1]
            x = 3.0 + 2.0 * torch.randn(*shape, generator=g, dtype=dtype)
            sublayer = nn.Sequential(nn.Linear(d, d), nn.Tanh()).to(dtype)
            norm = nn.LayerNorm(d).to(dtype)
            with torch.no_grad():
                for p in (*sublayer.parameters(), *norm.parameters()):
                    p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
            cases.append((desc, x, sublayer, norm))
    return cases


def _check_residual(fn: Callable, norm_first: bool, wrong: list[tuple[Callable, str]]) -> None:
    """Compare ``fn(x, sublayer, norm)`` with the pre-LN or post-LN formula; name known slips."""
    name = "pre_ln" if norm_first else "post_ln"
    formula = "x + Sublayer(LayerNorm(x))" if norm_first else "LayerNorm(x + Sublayer(x))"
    for desc, x, sublayer, norm in _residual_cases():
        where = f"for {desc}"
        with torch.no_grad():
            expected = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
            out = call_student(
                fn,
                (x, sublayer, norm),
                where,
                inputs="its input x",
                in_place_hint="the residual path needs the original x (write x + ..., not x += ...), and the "
                "caller may still use it: build a new tensor instead",
            )
        require_tensor(
            out, where, x.shape, x.dtype, what="the output", shape_hint=": a residual sublayer keeps the shape of x"
        )
        if close(out, expected):
            continue
        with torch.no_grad():
            for candidate, message in wrong:
                if close(out, candidate(x, sublayer, norm)):
                    raise ExerciseFailure(f"{where}: {message} {name} computes {formula}.")
        raise ExerciseFailure(
            f"{where}, the output differs from {formula}. At position (0, 0): expected "
            f"{fmt(expected[0, 0])}, got {fmt(out[0, 0])}."
        )


_PRE_LN_SLIPS = [
    (
        lambda x, f, n: n(x + f(x)),
        "your output equals LayerNorm(x + Sublayer(x)), the post-LN arrangement of the original paper. Pre-LN "
        "normalises the sublayer's input instead, and adds the raw x back without normalising the sum.",
    ),
    (
        lambda x, f, n: n(x + f(n(x))),
        "you applied the LayerNorm after adding the residual as well. In pre-LN the sum is returned as it is: "
        "only the sublayer's input is normalised.",
    ),
    (
        lambda x, f, n: f(n(x)),
        "the residual connection is missing: the sublayer's output must be added to x.",
    ),
    (
        lambda x, f, n: n(x) + f(n(x)),
        "the residual path carries the normalised x. It must carry the raw input x unchanged, so that the "
        "stack keeps an identity path from its input to its output.",
    ),
    (
        lambda x, f, n: f(x + n(x)),
        "the residual was added before the sublayer. The sublayer reads LayerNorm(x), and its output is what "
        "gets added to x.",
    ),
    (
        lambda x, f, n: x + f(x),
        "the LayerNorm is missing: the sublayer must read LayerNorm(x), not x.",
    ),
]

_POST_LN_SLIPS = [
    (
        lambda x, f, n: x + f(n(x)),
        "your output equals x + Sublayer(LayerNorm(x)), the pre-LN arrangement. Post-LN, as in the original "
        "paper, runs the sublayer on x itself and normalises the sum.",
    ),
    (
        lambda x, f, n: n(f(x)),
        "the residual connection is missing: add x to the sublayer's output before normalising.",
    ),
    (
        lambda x, f, n: x + n(f(x)),
        "you normalised the sublayer's output only. Post-LN normalises the sum x + Sublayer(x).",
    ),
    (
        lambda x, f, n: n(x) + f(x),
        "you added the sublayer's output to the normalised x. Post-LN adds first and then normalises the sum.",
    ),
    (
        lambda x, f, n: x + f(x),
        "the LayerNorm is missing: normalise the sum x + Sublayer(x).",
    ),
]


@check("check_pre_ln")
def check_pre_ln(fn: Callable[[Tensor, Callable, nn.Module], Tensor]) -> None:
    """Chapter "The transformer block", exercise 2: check ``fn(x, sublayer, norm)``, the pre-LN residual ``x +
    sublayer(norm(x))``.

    ``fn`` is given ``x (B, T, d_model)`` (float32 or float64), a non-linear ``sublayer`` and an
    ``nn.LayerNorm(d_model)``, and must return a new tensor of the shape and dtype of ``x``.
    """
    _check_residual(fn, norm_first=True, wrong=_PRE_LN_SLIPS)


@check("check_post_ln")
def check_post_ln(fn: Callable[[Tensor, Callable, nn.Module], Tensor]) -> None:
    """Chapter "The transformer block", exercise 2: check ``fn(x, sublayer, norm)``, the post-LN residual ``norm(x +
    sublayer(x))``.

    ``fn`` is given ``x (B, T, d_model)`` (float32 or float64), a non-linear ``sublayer`` and an
    ``nn.LayerNorm(d_model)``, and must return a new tensor of the shape and dtype of ``x``.
    """
    _check_residual(fn, norm_first=False, wrong=_POST_LN_SLIPS)
