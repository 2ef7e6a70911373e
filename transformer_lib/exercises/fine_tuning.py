"""Checks for chapter "Fine-tuning": the LoRA weight, the loss mask of a prompt/response
row and the number of parameters LoRA trains.

``reference_lora_weight``, ``reference_response_mask`` and ``reference_lora_parameter_count``
are the reference answers; each check prints one verdict line and returns a
:class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ._core import ExerciseFailure, call_student, check, close, fmt, require_int, require_tensor

__all__ = [
    "check_lora_parameter_count",
    "check_lora_weight",
    "check_response_mask",
    "reference_lora_parameter_count",
    "reference_lora_weight",
    "reference_response_mask",
]


# ---------------------------------------------------------------- ex-15-1: check_lora_weight


def reference_lora_weight(W: Tensor, A: Tensor, B: Tensor, alpha: float) -> Tensor:
    """The adapted weight ``W + (alpha / r) B A``, shape ``(out, in)``, with ``W (out, in)``,
    ``A (r, in)``, ``B (out, r)`` and ``r = A.shape[0]``; a new tensor, ``W`` is left as it is.
    What :class:`transformer_lib.lora.LoRA` computes (chapter "Fine-tuning")."""
    r = A.shape[0]
    return W + (alpha / r) * (B @ A)


def _first_mistake(wrong: dict[str, Tensor | None], actual: Tensor, right: Tensor) -> str | None:
    found = [
        m for m, w in wrong.items() if w is not None and close(actual, w, atol=1e-9) and not close(w, right, atol=1e-9)
    ]
    return found[0] if found else None


def _lora_shape_hint(exc: Exception) -> str:
    """Under a crash of the student's function: for a shape error, the shapes that fit."""
    if not any(word in str(exc) for word in ("size", "shape", "mat1", "dimension")):
        return ""
    return (
        "A is (r, in) and B is (out, r), so the update B @ A is (out, in), the shape of W; A @ B or a "
        "transpose only fits when the shapes happen to agree."
    )


@check("check_lora_weight")
def check_lora_weight(fn: Callable) -> None:
    """Chapter "Fine-tuning", exercise 1: check ``fn(W, A, B, alpha) -> (out, in)``, the adapted LoRA weight.

    ``fn`` is given float64 tensors ``W (out, in)``, ``A (r, in)`` and ``B (out, r)`` and a number
    ``alpha``, and returns ``W + (alpha / r) B A`` with ``r = A.shape[0]``, leaving ``W``, ``A``
    and ``B`` unchanged. Tried on a square weight first (out = in), then on weights with out != in,
    rank 1 and a scale alpha / r that is not a whole number.
    """
    g = torch.Generator().manual_seed(15)
    cases = [(4, 4, 2, 6.0), (5, 3, 2, 4.0), (3, 7, 3, 7.0), (6, 4, 1, 2.0), (8, 12, 4, 16.0)]
    for n_out, n_in, r, alpha in cases:
        W = torch.randn(n_out, n_in, generator=g, dtype=torch.float64)
        A = torch.randn(r, n_in, generator=g, dtype=torch.float64)
        B = torch.randn(n_out, r, generator=g, dtype=torch.float64)
        where = f"for W of shape ({n_out}, {n_in}), rank r = {r} and alpha = {alpha:g}"
        out = call_student(
            fn,
            (W, A, B, alpha),
            where,
            inputs="W, A or B",
            in_place_hint="W is the frozen pretrained weight: return W + (alpha / r) B A as a new tensor "
            "(W + ..., not W += ...)",
            crash_hint=_lora_shape_hint,
        )
        expected = reference_lora_weight(W, A, B, alpha)
        require_tensor(out, where, (n_out, n_in), what="the result", layout="(out, in), the shape of W")
        if out.dtype != W.dtype:
            raise ExerciseFailure(f"{where}, the result has dtype {out.dtype}; keep W's dtype {W.dtype}.")
        if not close(out, expected, atol=1e-9, rtol=1e-9):
            BA = B @ A
            wrong = {
                "you left out the scale: the update is (alpha / r) B A, not B A": W + BA,
                "you scaled by alpha; divide it by the rank r = A.shape[0], (alpha / r) B A": W + alpha * BA,
                "you scaled by r / alpha; the scale is alpha / r": W + (r / alpha) * BA,
                "you used integer division, alpha // r; the scale alpha / r is a float": W + (alpha // r) * BA,
                "you subtracted the update; LoRA adds it, W + (alpha / r) B A": W - (alpha / r) * BA,
                "you returned only the update (alpha / r) B A; add it to the frozen W": (alpha / r) * BA,
                "you returned W unchanged; add the update (alpha / r) B A": W,
                "you added the transpose of B A (A^T B^T); the update is B @ A, (out, r) @ (r, in) = (out, in)": (
                    W + (alpha / r) * BA.T if n_out == n_in else None
                ),
            }
            mistake = _first_mistake(wrong, out, expected)
            detail = f"expected {fmt(expected)}, got {fmt(out)}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")


# ---------------------------------------------------------------- ex-15-2: check_response_mask


def reference_response_mask(n_prompt: int, n_tokens: int, context_len: int) -> Tensor:
    """The loss mask ``(context_len,)`` of one prompt/response row (chapter "Fine-tuning"): ``True`` at the
    positions ``n_prompt - 1 .. n_tokens - 2``, whose targets are the response's tokens and the
    end token, for a row of ``n_tokens`` ids laid out as inputs ``ids[:-1]`` and targets
    ``ids[1:]`` padded to ``context_len``; the rule of
    :class:`transformer_lib.data.instructions.InstructionBatches`."""
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[n_prompt - 1 : n_tokens - 1] = True  # the input at k predicts ids[k + 1]
    return mask


def _span(context_len: int, start: int, stop: int) -> Tensor:
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[max(start, 0) : max(stop, 0)] = True
    return mask


@check("check_response_mask")
def check_response_mask(fn: Callable) -> None:
    """Chapter "Fine-tuning", exercise 2: check ``fn(n_prompt, n_tokens, context_len) -> (context_len,)``,
    the bool loss mask of a prompt/response row.

    ``fn`` is given three ints: a row of ``n_tokens`` ids (``n_prompt`` of the prompt, then the
    response and its end token), laid out as inputs ``ids[:-1]`` and targets ``ids[1:]`` padded
    to ``context_len``. It returns a bool tensor, ``True`` exactly where the target is a response
    token or the end token: positions ``n_prompt - 1`` to ``n_tokens - 2``. Tried on short rows,
    a one-token prompt and response, a row that fills the context and a long padded one.
    """
    cases = [(3, 7, 10), (1, 3, 4), (2, 4, 8), (4, 9, 8), (5, 8, 8), (6, 20, 32)]
    for n_prompt, n_tokens, context_len in cases:
        where = f"for n_prompt = {n_prompt}, n_tokens = {n_tokens}, context_len = {context_len}"
        out = call_student(fn, (n_prompt, n_tokens, context_len), where, crash_hint="")
        expected = reference_response_mask(n_prompt, n_tokens, context_len)
        require_tensor(
            out,
            where,
            (context_len,),
            torch.bool,
            what="the mask",
            layout="(context_len,), one entry per position of the padded row",
            dtype_hint=": True marks a target the loss learns from; build it with "
            "torch.zeros(context_len, dtype=torch.bool)",
        )
        if torch.equal(out, expected):
            continue
        last = n_tokens - 2
        wrong = {
            f"the response's first token is never learned: its target sits at position n_prompt - 1 = "
            f"{n_prompt - 1} (the input at k predicts ids[k + 1]), and you started at n_prompt": _span(
                context_len, n_prompt, n_tokens - 1
            ),
            f"the end token is never learned, so the model never learns to stop: it is the target at "
            f"position n_tokens - 2 = {last}, and you stopped one early": _span(context_len, n_prompt - 1, last),
            "you marked the response's positions in ids; the mask goes with the targets ids[1:], one "
            f"position to the left: from n_prompt - 1 = {n_prompt - 1} to n_tokens - 2 = {last}": _span(
                context_len, n_prompt, n_tokens
            ),
            "you included the prompt and the padding: only the response's targets and the end token count": _span(
                context_len, 0, context_len
            ),
            "you included the prompt's targets: the prompt is given, not predicted, so start at n_prompt - "
            f"1 = {n_prompt - 1}": _span(context_len, 0, n_tokens - 1),
            "you included the padding: the positions from n_tokens - 1 = "
            f"{n_tokens - 1} on have pad ids as targets, not tokens; stop at n_tokens - 2 = {last}": _span(
                context_len, n_prompt - 1, context_len
            ),
        }
        found = [m for m, w in wrong.items() if torch.equal(out, w) and not torch.equal(w, expected)]
        detail = f"expected {fmt(expected)}, got {fmt(out)}"
        raise ExerciseFailure(f"{where}, {found[0]}; {detail}." if found else f"{where}, {detail}.")


# ---------------------------------------------------------------- ex-15-3: check_lora_parameter_count


def reference_lora_parameter_count(shapes: Sequence[tuple[int, int]], rank: int) -> int:
    """The number of trainable parameters of rank-``rank`` LoRA adapters on weights of ``shapes``
    ``(out, in)`` (chapter "Fine-tuning"): ``A (r, in)`` and ``B (out, r)`` for each, ``r (out + in)``,
    summed; what :func:`transformer_lib.lora.count_parameters` counts after
    :func:`~transformer_lib.lora.add_lora`."""
    return sum(rank * (n_out + n_in) for n_out, n_in in shapes)


def _count_hint(got: int, shapes: list[tuple[int, int]], r: int) -> str:
    """A sentence naming the likely slip behind a wrong count, or a general hint."""
    per = {
        "you counted r * out * in, as if there were r full (out, in) matrices; A (r, in) and B (out, r) "
        "hold r * in + out * r = r * (out + in)": lambda o, i: r * o * i,
        "you counted only A (r x in); B (out x r) is trained too, r * (out + in) in all": lambda o, i: r * i,
        "you counted only B (out x r); A (r x in) is trained too, r * (out + in) in all": lambda o, i: r * o,
        "you gave A and B the larger side each, 2 r max(out, in); A is (r, in) and B is (out, r)": lambda o, i: (
            2 * r * max(o, i)
        ),
        "you left out the rank: A and B have r rows and columns, r * (out + in)": lambda o, i: o + i,
        "you counted the frozen weights W too (out * in each); only A and B are trained": lambda o, i: (
            o * i + r * (o + i)
        ),
    }
    right = reference_lora_parameter_count(shapes, r)
    for hint, count in per.items():
        total = sum(count(o, i) for o, i in shapes)
        if got == total != right:
            return hint
    if len(shapes) > 1 and got == reference_lora_parameter_count(shapes[:1], r):
        return "you counted only the first weight; sum r * (out + in) over every shape"
    return "each weight (out, in) gets A (r, in) and B (out, r): r * (out + in) numbers, summed over the weights"


def _count_cases() -> list[tuple[str, list[tuple[int, int]], int]]:
    """(how the call is written in messages, shapes, rank), from small to a GPT-2's attention."""
    gpt2 = [(2304, 768), (768, 768)] * 12
    small = [[(6, 4)], [(6, 4), (3, 8)], [(5, 3)], [(64, 16), (16, 64), (48, 16)], [(8, 8)], []]
    ranks = [2, 3, 1, 4, 8, 4]
    cases = [(f"lora_parameter_count({s}, {r})", s, r) for s, r in zip(small, ranks, strict=True)]
    cases.append(("lora_parameter_count(shapes, 8) for GPT-2's 12 layers of [(2304, 768), (768, 768)]", gpt2, 8))
    return cases


@check("check_lora_parameter_count")
def check_lora_parameter_count(fn: Callable) -> None:
    """Chapter "Fine-tuning", exercise 3: check ``fn(shapes, rank) -> int``, the number of parameters LoRA trains.

    ``fn`` is given a list of weight shapes ``(out, in)`` (tuples of ints) and the rank ``r``, an
    int, and returns ``r * (out + in)`` summed over the shapes as an int: the sizes of each
    weight's ``A (r, in)`` and ``B (out, r)``. Tried on one weight, several, rank 1, a square
    weight, no weight at all and GPT-2's attention weights.
    """
    for call, shapes, rank in _count_cases():
        got = call_student(fn, (list(shapes), rank), call, crash_hint="")
        got = require_int(got, call, " (a number of parameters)")
        want = reference_lora_parameter_count(shapes, rank)
        if got != want:
            hint = _count_hint(got, shapes, rank)
            raise ExerciseFailure(f"{call}: LoRA trains {want} parameters, your function returned {got}: {hint}.")
