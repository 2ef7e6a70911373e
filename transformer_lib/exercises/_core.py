"""The machinery every exercise check shares: the verdict, the decorator and the argument guards.

A check builds a phrase that says where it is, such as ``"for T=3"`` or ``"for x of shape
(2, 3, 4)"``, and hands it to the guards below. Each guard tests one thing about the student's
function or what it returned (that it runs, leaves its inputs alone, returns a tensor, a pair or
an int, with the right shape, dtype and finite values) and raises :class:`ExerciseFailure` with
a sentence that starts with that phrase. The chapter modules only add what is particular to
their exercise: the inputs to try and the sentences that name a likely mistake.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._checks import is_int

__all__ = [
    "CheckResult",
    "ExerciseFailure",
    "call_student",
    "check",
    "close",
    "fmt",
    "require_dtype",
    "require_finite",
    "require_int",
    "require_pair",
    "require_shape",
    "require_tensor",
    "require_tensors",
]


class ExerciseFailure(AssertionError):
    """Raised inside a check to report a wrong answer in words a student understands."""


@dataclass
class CheckResult:
    """What a check concluded: ``status`` is "passed", "failed", "not implemented" or "error"."""

    name: str
    status: str
    message: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckResult({self.name!r}, {self.status!r})"


def fmt(t, decimals: int = 4) -> str:
    """A short, rounded rendering of a tensor (or number) for messages."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        if t.dtype == torch.bool:
            return str(t.int().tolist())
        if t.is_floating_point():
            return str(torch.round(t.double(), decimals=decimals).tolist())
        return str(t.tolist())
    if isinstance(t, float):
        return f"{t:.{decimals}g}"
    return repr(t)


def close(actual, expected, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """True when two tensors have the same shape and are element-wise close (NaN is never close)."""
    if not isinstance(actual, torch.Tensor):
        return False
    if actual.shape != expected.shape:
        return False
    return bool(torch.allclose(actual.double(), expected.double(), atol=atol, rtol=rtol))


def _run(name: str, body: Callable, fn, args: tuple, kwargs: dict) -> CheckResult:
    """Run one check's body on the student's ``fn`` and turn what happened into a verdict."""
    if not callable(fn):
        return CheckResult(
            name,
            "failed",
            f"Not yet: {name} needs your function itself, but it was given {_a(type(fn).__name__)}. Pass the "
            "function's name without calling it: check(my_function), not check(my_function()).",
        )
    try:
        body(fn, *args, **kwargs)
    except NotImplementedError:
        return CheckResult(name, "not implemented", f"{name}: not implemented yet.")
    except ExerciseFailure as exc:
        return CheckResult(name, "failed", f"Not yet: {exc}")
    except Exception as exc:  # the student's code crashed: report it, do not raise
        return CheckResult(name, "error", f"{name}: your function raised {type(exc).__name__}: {_first_line(exc)}")
    return CheckResult(name, "passed", f"Correct: {name} passed every test case.")


def check(name: str) -> Callable:
    """Decorator that turns a function raising :class:`ExerciseFailure` into a printing check.

    The wrapped check first makes sure it was given a function, prints one verdict line and
    returns a :class:`CheckResult`; it never raises.
    """

    def wrap(body: Callable) -> Callable:
        @functools.wraps(body)
        def run(fn: Callable, *args, verbose: bool = True, **kwargs) -> CheckResult:
            result = _run(name, body, fn, args, kwargs)
            if verbose:
                print(result.message)
            return result

        return run

    return wrap


# ---------------------------------------------------------------------------------------------
# Guards: each raises ExerciseFailure with a sentence that starts with ``where``.


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a list", "an int"."""
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _has(what: str) -> str:
    """The verb that goes with ``what``: "the weights have", "the mask has"."""
    last = what.split()[-1]
    return "have" if last.endswith("s") and not last.endswith("ss") else "has"  # "the loss has"


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def _first_line(exc: Exception) -> str:
    """The first line of an exception's message, so that a verdict stays on one line."""
    return str(exc).splitlines()[0] if str(exc) else "no message"


def call_student(
    fn: Callable,
    args: Sequence,
    where: str,
    *,
    crash_hint: str | Callable[[Exception], str | None] | None = None,
    inputs: str | None = None,
    in_place_hint: str = "build a new tensor instead",
):
    """``fn(*args)`` on copies of the tensor arguments; the result, or a failure naming the input.

    ``crash_hint`` turns an exception raised by ``fn`` into a failure: a sentence (``""`` for
    none), or a function of the exception that returns one, or ``None`` to let the exception
    through (the check then reports an error). ``NotImplementedError`` always goes through.
    With ``inputs`` (how the message names them, e.g. ``"q or k"``), ``fn`` must leave its
    tensor arguments unchanged.
    """
    copies = [a.clone() if isinstance(a, Tensor) else a for a in args]
    try:
        result = fn(*copies)
    except NotImplementedError:
        raise
    except Exception as exc:
        hint = crash_hint(exc) if callable(crash_hint) else crash_hint
        if hint is None:
            raise
        raise ExerciseFailure(
            _sentence(f"{where}, your function raised {type(exc).__name__}: {_first_line(exc)}")
            + (f" {hint}" if hint else "")
        ) from None
    changed = [isinstance(a, Tensor) and not torch.equal(a, c) for a, c in zip(args, copies, strict=True)]
    if inputs is not None and any(changed):
        raise ExerciseFailure(f"{where}, your function changed {inputs} in place; {_sentence(in_place_hint)}")
    return result


def require_shape(value: Tensor, shape: Sequence[int], where: str, *, what="the result", layout="", hint="") -> None:
    """Fail unless ``value.shape == shape``; ``layout`` names the axes, e.g. ``"(B, T)"``."""
    if tuple(value.shape) != tuple(shape):
        expected = f"{layout} = {tuple(shape)}" if layout else str(tuple(shape))
        raise ExerciseFailure(
            _sentence(f"{where}, {what} {_has(what)} shape {tuple(value.shape)}; expected {expected}{hint}")
        )


def require_dtype(value: Tensor, dtype: torch.dtype | str, where: str, *, what="the result", hint="") -> None:
    """Fail unless ``value`` has ``dtype``, or is of a kind: ``"floating"`` or ``"integer"``."""
    if dtype == "floating":
        ok, expected = value.is_floating_point(), "a floating-point dtype"
    elif dtype == "integer":
        ok, expected = (
            not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool,
            ("an integer dtype"),
        )
    else:
        ok, expected = value.dtype == dtype, str(dtype)
    if not ok:
        raise ExerciseFailure(_sentence(f"{where}, {what} {_has(what)} dtype {value.dtype}; expected {expected}{hint}"))


def require_tensor(
    value,
    where: str,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    what: str = "the result",
    layout: str = "",
    shape_hint: str = "",
    dtype_hint: str = "",
) -> Tensor:
    """Fail unless ``value`` is a tensor (then, when given, of ``shape`` and ``dtype``); return it."""
    if not isinstance(value, Tensor):
        raise ExerciseFailure(f"{where}, your function returned {_a(type(value).__name__)}; return a torch.Tensor.")
    if shape is not None:
        require_shape(value, shape, where, what=what, layout=layout, hint=shape_hint)
    if dtype is not None:
        require_dtype(value, dtype, where, what=what, hint=dtype_hint)
    return value


def require_tensors(value, where: str, names: tuple[str, ...]) -> tuple[Tensor, ...]:
    """Fail unless ``value`` is a tuple or list of ``len(names)`` tensors, named ``names`` in
    messages; return them as a tuple."""
    n, listed = len(names), ", ".join(names)
    count = {2: "two", 3: "three"}.get(n, str(n))
    wanted = (
        f"return a pair ({listed}) of torch tensors."
        if n == 2
        else f"return a tuple ({listed}) of {count} torch tensors."
    )
    if not isinstance(value, tuple | list) or len(value) != n:
        got = _a(type(value).__name__) + (f" of length {len(value)}" if isinstance(value, tuple | list) else "")
        raise ExerciseFailure(f"{where}, your function returned {got}; {wanted}")
    for name, item in zip(names, value, strict=True):
        if not isinstance(item, Tensor):
            raise ExerciseFailure(f"{where}, {name} is {_a(type(item).__name__)}; {wanted}")
    return tuple(value)


def require_pair(value, where: str, names: tuple[str, str]) -> tuple[Tensor, Tensor]:
    """:func:`require_tensors` for two: fail unless ``value`` is a pair of tensors; return them."""
    return require_tensors(value, where, names)


def require_int(value, call: str, hint: str = "") -> int:
    """Fail unless ``value`` is a whole number: an int (not a bool) or a one-element integer tensor."""
    if isinstance(value, Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        if not (value.is_floating_point() or value.is_complex()):
            return int(value)
    if not is_int(value):
        raise ExerciseFailure(
            _sentence(f"{call} returned {value!r}, {_a(type(value).__name__)}; return a whole number as an int{hint}")
        )
    return int(value)


def require_finite(value: Tensor, where: str, *, what: str = "the result", hint: str = "") -> None:
    """Fail when ``value`` holds NaN or an infinity."""
    if not torch.isfinite(value).all():
        raise ExerciseFailure(_sentence(f"{where}, {what} contains NaN or inf ({fmt(value)}){hint}"))
