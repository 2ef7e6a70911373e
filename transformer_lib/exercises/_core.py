"""The machinery every exercise check shares."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CheckResult", "ExerciseFailure", "check", "close", "fmt"]


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


def check(name: str) -> Callable:
    """Decorator that turns a function raising :class:`ExerciseFailure` into a printing check.

    The wrapped check prints one verdict line and returns a :class:`CheckResult`.
    """

    def wrap(body: Callable) -> Callable:
        @functools.wraps(body)
        def run(fn: Callable, *args, verbose: bool = True, **kwargs) -> CheckResult:
            try:
                body(fn, *args, **kwargs)
                result = CheckResult(name, "passed", f"Correct: {name} passed every test case.")
            except NotImplementedError:
                result = CheckResult(name, "not implemented", f"{name}: not implemented yet.")
            except ExerciseFailure as exc:
                result = CheckResult(name, "failed", f"Not yet: {exc}")
            except Exception as exc:  # the student's code crashed: report it, do not raise
                result = CheckResult(name, "error", f"{name}: your function raised {type(exc).__name__}: {exc}")
            if verbose:
                print(result.message)
            return result

        return run

    return wrap
