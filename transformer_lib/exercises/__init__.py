"""Checks for the chapters' coding exercises (see the instructor's guide).

Each ``check_*`` function takes a student's function, runs it on generated inputs (edge cases
included) and prints a one-line verdict: what is wrong, with the smallest failing input and the
expected versus actual values, or that the answer is right. A function that still raises
``NotImplementedError`` (the student edition's stub) is reported as "not implemented yet".
Checks return a :class:`CheckResult` and never raise, so a notebook always runs on.

One module per chapter: ``transformer_lib.exercises.ch04`` holds chapter 4's checks.
"""

import importlib
import pkgutil

from ._core import CheckResult, check

__all__ = ["CheckResult", "check"]

for _module in pkgutil.iter_modules(__path__):
    if _module.name.startswith("ch"):
        globals()[_module.name] = importlib.import_module(f"{__name__}.{_module.name}")
        __all__.append(_module.name)
