"""Checks for the chapter "Longer than trained": the rotary frequencies of NTK-aware scaling and of
YaRN, which let a model trained on ``L`` tokens read ``s L``.

Both exercises return ``omega (d/2,)``, one angular frequency per pair of a ``d``-wide head, and
both checks compare it with :class:`~transformer_lib.RopeScaling`'s ``frequencies``. A wrong
answer is shown as what it does to each pair: the number the plain rotary frequency
``base^(-2i/d)`` is divided by (1: the pair is kept; ``s``: it is interpolated).

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..positional import sinusoidal_frequencies
from ..rope_scaling import RopeScaling
from ._core import ExerciseFailure, call_student, check, require_dtype, require_finite, require_shape, require_tensor

__all__ = ["check_ntk_frequencies", "check_yarn_frequencies"]

_CRASH_HINT = (
    "d, base and factor are Python numbers (d an even int): build the pair indices with "
    "torch.arange(0, d, 2, dtype=torch.float64); math.log takes numbers, torch.log tensors."
)


def _same(actual: Tensor, expected: Tensor) -> bool:
    """Equal shapes and every entry within 1e-4 of the expected one, *relative*: the slowest
    frequencies are near 1e-6, so an absolute tolerance would call different answers equal."""
    return actual.shape == expected.shape and torch.allclose(actual.detach().double(), expected, rtol=1e-4, atol=0)


def _numbers(t: Tensor) -> str:
    """``[1, 1.414, 2]``: four significant digits, since frequencies span several orders of magnitude."""
    return "[" + ", ".join(f"{x:.4g}" for x in t.tolist()) + "]"


def _detail(omega: Tensor, right: Tensor, d: int, base: float) -> str:
    """What each pair's plain frequency ``base^(-2i/d)`` is divided by, expected against got: the
    whole ``(d/2,)`` vector for a small head, else the first pair that differs."""
    plain = sinusoidal_frequencies(d, base=base)  # (d/2,)
    want, have = plain / right, plain / omega.detach().double()
    if d // 2 <= 16:
        return f"each pair's base^(-2i/d) should be divided by {_numbers(want)}, yours is divided by {_numbers(have)}"
    differs = ~torch.isclose(omega.detach().double(), right, rtol=1e-4, atol=0)
    i = int(differs.nonzero()[0, 0]) if bool(differs.any()) else 0
    return (
        f"pair {i} of {d // 2} (base^(-2i/d) = {float(plain[i]):.4g}) should be divided by {float(want[i]):.4g}, "
        f"yours is divided by {float(have[i]):.4g}"
    )


def _require_omega(out, d: int, where: str, nan_hint: str = "") -> Tensor:
    """Fail unless ``out`` is a finite floating-point ``(d/2,)`` tensor; return it."""
    if isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[0], Tensor):
        raise ExerciseFailure(
            f"{where}, your function returned a pair; return omega alone, a (d/2,) tensor (RopeScaling.frequencies "
            "returns (omega, attention_factor): the attention factor multiplies cos and sin, it is no frequency)."
        )
    require_tensor(out, where, what="omega")
    every_dimension = ": one frequency per pair of dimensions, 2i and 2i + 1, so d/2 of them, not one per dimension"
    require_shape(
        out, (d // 2,), where, what="omega", layout="(d/2,)", hint=every_dimension if tuple(out.shape) == (d,) else ""
    )
    require_dtype(
        out,
        "floating",
        where,
        what="omega",
        hint="; frequencies are fractions: compute them in floating point (float64)",
    )
    require_finite(out, where, what="omega", hint=nan_hint)
    return out


def _name_mistake(omega: Tensor, right: Tensor, mistakes: list[tuple[str, Tensor]], where: str, detail: str) -> None:
    """Raise the first mistake whose answer is ``omega`` (and differs from the right one)."""
    for mistake, wrong in mistakes:
        if _same(omega, wrong) and not _same(wrong, right):
            raise ExerciseFailure(f"{where}, {mistake}; {detail}.")


# ---------------------------------------------------------------------------------------------
# Exercise 1 of chapter "Longer than trained": NTK-aware scaling


def _ntk(d: int, base: float, factor: float) -> Tensor:
    """The right answer, ``(d/2,)`` float64: the library's NTK-aware frequencies."""
    return RopeScaling("ntk", factor=float(factor)).frequencies(d, base)[0]


def _ntk_mistakes(d: int, base: float, s: float) -> list[tuple[str, Tensor]]:
    """Likely wrong NTK frequencies, each ``(what went wrong, omega (d/2,) float64)``."""
    plain, right = sinusoidal_frequencies(d, base=base), _ntk(d, base, s)
    wavelengths = (
        "you returned wavelengths, {}; return the angular frequencies omega_i = new_base^(-2i/d), which fall from 1 "
        "(pair 0) to the slowest (the last pair)"
    )
    return [
        (
            "the exponent is dropped: the new base is base * s^(d / (d - 2)), not base * s; with the exponent the "
            "slowest pair comes out divided by exactly s, without it by less",
            sinusoidal_frequencies(d, base=base * s),
        ),
        (
            "the exponent is upside down: the new base is base * s^(d / (d - 2)), not base * s^((d - 2) / d)",
            sinusoidal_frequencies(d, base=base * s ** ((d - 2) / d)),
        ),
        (
            "you divided every frequency by s: that is position interpolation, which slows the fast pairs as "
            "much as the slow ones; NTK-aware scaling enlarges the base instead, so the fastest pair keeps "
            "omega_0 = 1 and only the slow ones slow down",
            plain / s,
        ),
        (
            "you divided every frequency by s^(d / (d - 2)); that number multiplies the base, base * s^(d / (d - 2)), "
            "and the frequencies are that new base's, new_base^(-2i/d)",
            plain / s ** (d / (d - 2)),
        ),
        (
            "the frequencies are in the wrong order: pair i has omega_i = new_base^(-2i/d), so they fall from "
            "omega_0 = 1; yours rise",
            right.flip(0),
        ),
        (wavelengths.format("1 / omega"), 1 / right),
        (wavelengths.format("2 pi / omega"), 2 * math.pi / right),
        (
            "the factor has no effect: these are the plain rotary frequencies base^(-2i/d); NTK-aware scaling "
            "takes those of the new base base * s^(d / (d - 2))",
            plain,
        ),
    ]


@check("check_ntk_frequencies")
def check_ntk_frequencies(fn: Callable) -> None:
    """Chapter "Longer than trained", exercise 1: check ``fn(d, base, factor) -> omega (d/2,)``, NTK-aware scaling.

    ``fn`` is given a head's width ``d`` (even), the rotary base and the factor ``s`` (the new length
    over the trained one) as Python numbers. It returns the rotary frequencies of the larger base
    ``base * s^(d / (d - 2))``: ``omega_i = (base * s^(d / (d - 2)))^(-2i/d)`` for ``i = 0 .. d/2 - 1``,
    a floating-point ``(d/2,)`` tensor. The fastest pair keeps ``omega_0 = 1`` and the slowest is
    divided by exactly ``s``. Compared with :class:`~transformer_lib.RopeScaling` ``("ntk")`` to a
    relative 1e-4 for heads of 4 to 64 dimensions, bases 10^4 and 5 10^5, factors 2 to 8 and 1 (no
    change).
    """
    cases = [(4, 10000.0, 2.0), (8, 10000.0, 4), (16, 500000.0, 8.0), (64, 10000.0, 2.5), (6, 10000.0, 1.0)]
    for d, base, s in cases:
        where = f"for d = {d}, base = {base:g}, factor = {s:g}"
        omega = _require_omega(call_student(fn, (d, base, s), where, crash_hint=_CRASH_HINT), d, where)
        right = _ntk(d, base, s)
        if _same(omega, right):
            continue
        detail = _detail(omega, right, d, base)
        _name_mistake(omega, right, _ntk_mistakes(d, base, s), where, detail)
        new_base = base * s ** (d / (d - 2))
        raise ExerciseFailure(
            f"{where}, {detail}. NTK-aware scaling keeps omega_0 = 1 and divides the slowest pair by exactly s: "
            f"it is the rotary frequencies of the base base * s^(d / (d - 2)) = {new_base:.6g}."
        )


# ---------------------------------------------------------------------------------------------
# Exercise 2 of chapter "Longer than trained": YaRN


def _yarn(d: int, base: float, s: float, L: int, beta_fast: float, beta_slow: float, truncate: bool = True) -> Tensor:
    """YaRN's frequencies, ``(d/2,)`` float64, from the library: the ramp's ends from ``L`` tokens,
    rounded to whole pairs when ``truncate``."""
    spec = RopeScaling(
        "yarn",
        factor=float(s),
        original_context=L,
        beta_fast=float(beta_fast),
        beta_slow=float(beta_slow),
        truncate=truncate,
    )
    return spec.frequencies(d, base)[0]


_REVERSED = (
    "the ramp is reversed: you interpolated the fast pairs (those turning more than beta_fast times over L) and "
    "kept the slow ones; YaRN keeps the fast pairs, whose angles the model has seen many times over, and divides "
    "the slow ones by s"
)


def _yarn_mistakes(d, base, s, L, beta_fast, beta_slow) -> list[tuple[str, Tensor]]:
    """Likely wrong YaRN frequencies, each ``(what went wrong, omega (d/2,) float64)``."""
    plain, right = sinusoidal_frequencies(d, base=base), _yarn(d, base, s, L, beta_fast, beta_slow)
    new_length = round(s * L)
    ramp_from_new = (
        f"you computed the ramp from the new length s L = {new_length}; a pair's turns are counted over the "
        f"trained length L = {L}, the angles the model has seen (pair i turns L omega_i / (2 pi) times)"
    )
    attention = RopeScaling("yarn", float(s)).yarn_attention_factor()
    folded = (
        f"you folded the attention factor ({attention:.4g} = 0.1 ln s + 1) into the frequencies; it multiplies "
        "cos and sin (so the scores by its square), and the frequencies stay those of the ramp"
    )
    return [
        (ramp_from_new, _yarn(d, base, s, new_length, beta_fast, beta_slow)),
        (_REVERSED, plain + plain / s - right),  # the blend omega (1 - r) + omega / s r with r and 1 - r swapped
        (
            "the ramp's ends are not rounded: as transformers by default (truncate=True), round the lower end "
            "down and the upper end up to whole pairs, math.floor(low) and math.ceil(high)",
            _yarn(d, base, s, L, beta_fast, beta_slow, truncate=False),
        ),
        (
            ramp_from_new + ", and round its ends to whole pairs",
            _yarn(d, base, s, new_length, beta_fast, beta_slow, False),
        ),
        (folded, right * attention),
        (folded, right / attention),
        (
            "you divided every frequency by s: that is position interpolation; YaRN keeps the pairs that turn "
            "more than beta_fast times over L and divides by s only those turning fewer than beta_slow times",
            plain / s,
        ),
        (
            "these are NTK-aware frequencies (a larger base); YaRN blends each pair between kept and divided "
            "by s along a ramp over the pair index",
            _ntk(d, base, s),
        ),
        ("the factor has no effect: these are the plain rotary frequencies base^(-2i/d)", plain),
    ]


@check("check_yarn_frequencies")
def check_yarn_frequencies(fn: Callable) -> None:
    """Chapter "Longer than trained", exercise 2: check ``fn(d, base, factor, original_context, beta_fast=32,
    beta_slow=1) -> omega (d/2,)``, YaRN's frequencies.

    ``fn`` is given a head's width ``d`` (even), the rotary base, the factor ``s``, the trained
    length ``L`` (an int) and the ramp's two numbers of turns, all as Python numbers, passed by
    position. Pair ``i`` turns ``L omega_i / (2 pi)`` times over the trained length (``omega_i =
    base^(-2i/d)``); the pair index where that equals ``beta`` is ``d ln(L / (2 pi beta)) / (2 ln
    base)``. The ramp runs from that index for ``beta_fast``, rounded down, to the one for
    ``beta_slow``, rounded up (transformers' ``truncate=True``), clipped to ``[0, d - 1]`` (when the
    two ends meet, transformers adds 0.001 to the upper one): ``r_i = clamp((i - low) / (high - low),
    0, 1)``, and ``omega'_i = omega_i (1 - r_i) + (omega_i / s) r_i``. The attention factor is not
    part of the frequencies. Returns a floating-point ``(d/2,)`` tensor, compared with
    :class:`~transformer_lib.RopeScaling` ``("yarn")`` to a relative 1e-4 for heads of 8 to 128
    dimensions, trained lengths 4 to 8192, the default and other ``beta`` and a factor of 1.
    """
    meet = (
        ": both ends of the ramp round to pair 0, so high - low is 0; as transformers, add 0.001 to high when they meet"
    )
    cases = [  # (d, base, s, L, beta_fast, beta_slow, what a NaN means)
        (16, 10000.0, 4.0, 64, 32.0, 1.0, ""),
        (64, 10000.0, 4.0, 4096, 32.0, 1.0, ""),
        (32, 10000.0, 2.0, 256, 16.0, 2.0, ""),
        (128, 500000.0, 8.0, 8192, 32.0, 1.0, ""),
        (16, 10000.0, 1.0, 64, 32.0, 1.0, ""),
        (8, 10000.0, 2.0, 4, 32.0, 1.0, meet),  # every pair turns less than once over L = 4
    ]
    for d, base, s, L, beta_fast, beta_slow, nan_hint in cases:
        where = f"for d = {d}, base = {base:g}, factor = {s:g}, original_context = {L}"
        if (beta_fast, beta_slow) != (32.0, 1.0):
            where += f", beta_fast = {beta_fast:g}, beta_slow = {beta_slow:g}"
        out = call_student(fn, (d, base, s, L, beta_fast, beta_slow), where, crash_hint=_CRASH_HINT)
        omega = _require_omega(out, d, where, nan_hint)
        right = _yarn(d, base, s, L, beta_fast, beta_slow)
        if _same(omega, right):
            continue
        detail = _detail(omega, right, d, base)
        _name_mistake(omega, right, _yarn_mistakes(d, base, s, L, beta_fast, beta_slow), where, detail)
        divisors = sinusoidal_frequencies(d, base=base) / omega.detach().double()  # (d/2,): 1 kept, s interpolated
        between = bool(((divisors > 1 - 1e-4) & (divisors < s * (1 + 1e-4))).all())  # each pair kept, blended or / s
        if between and divisors[0] > divisors[-1] * (1 + 1e-4):  # the fastest pair slowed down more than the slowest
            raise ExerciseFailure(f"{where}, {_REVERSED}; {detail}.")
        raise ExerciseFailure(
            f"{where}, {detail}. YaRN keeps the pairs turning more than beta_fast times over the trained length "
            f"L, divides by s = {s:g} those turning fewer than beta_slow times, and blends linearly along the "
            "pair index between (the ramp's ends rounded down and up to whole pairs)."
        )
