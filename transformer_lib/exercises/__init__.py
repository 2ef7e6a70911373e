"""Checks for the chapters' coding exercises (see the instructor's guide).

Each ``check_*`` function takes a student's function, runs it on generated inputs (edge cases
included) and prints a one-line verdict: what is wrong, with the smallest failing input and the
expected versus actual values, or that the answer is right. A function that still raises
``NotImplementedError`` (the student edition's stub) is reported as "not implemented yet".
Checks return a :class:`CheckResult` and never raise, so a notebook always runs on.

One module per chapter, named by the chapter's slug (:mod:`transformer_lib.chapters`):
``transformer_lib.exercises.masking`` holds the checks of ``chapters/04_masking.ipynb``;
:func:`module_for` says which. The modules' old names, by the chapters' numbers
(``transformer_lib.exercises.ch04``), still work: each is the same module under a second name.
"""

import importlib
import pkgutil
import re
import sys

from ..chapters import OLD_NAMES
from ._core import CheckResult, check

__all__ = ["CheckResult", "check", "module_for"]

_MODULES = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
for _name in _MODULES:
    globals()[_name] = importlib.import_module(f"{__name__}.{_name}")
    __all__.append(_name)
for _old, _name in OLD_NAMES.items():  # the old names: tl.exercises.ch04, `from ....ch04 import`
    if _name in _MODULES:
        globals()[_old] = sys.modules[f"{__name__}.{_old}"] = globals()[_name]


def module_for(notebook: str) -> str | None:
    """The name of the module that holds the checks of a chapter's notebook, or None if none does.

    ``notebook`` is the notebook's file name, ``NN_name.ipynb``: its module is ``name``, the
    chapter's slug, when one is called so (``"04_masking.ipynb"`` -> ``"masking"``). The number
    ``NN`` plays no part, so a chapter renumbered keeps its module.
    """
    match = re.fullmatch(r"(\d\d)_(\w+)\.ipynb", notebook.rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(f"a chapter's notebook is named NN_name.ipynb, got {notebook!r}")
    name = match.group(2)
    return name if name in _MODULES else None
