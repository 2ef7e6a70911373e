"""Shared by the exercise-check tests: one table row per student answer, one way to judge it.

Each chapter's test module lists the answers its checks must accept or reject as rows made by
:func:`case`: the check, the student's function, the verdict status it must get and the words
its message must contain. A :class:`Table` collects them; its ``add`` decorator puts a named
answer's row right above the answer's code. :func:`assert_verdict` runs a row and checks, besides the status and
the words, what every verdict promises: one line, starting the way its status says.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

#: the argument names of a table of cases, for ``pytest.mark.parametrize``
FIELDS = ("check", "fn", "status", "phrases")


def case(check: Callable, fn: Callable, status: str, *phrases: str, id: str | None = None):
    """One row: ``check(fn)`` must end with ``status`` and a message holding every phrase.

    The row's id is the check's and the function's names; a lambda needs an explicit ``id``.
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    if id is None:
        assert name != "<lambda>", "give a row for a lambda an explicit id"
        id = name
    return pytest.param(check, fn, status, phrases, id=f"{check.__name__}-{id}")


class Table(list):
    """A chapter's verdict cases, to pass to ``pytest.mark.parametrize(FIELDS, table)``."""

    def add(self, check: Callable, status: str, *phrases: str, id: str | None = None) -> Callable:
        """Decorator: add the row ``case(check, fn, status, *phrases)`` for the function below."""

        def register(fn: Callable) -> Callable:
            self.append(case(check, fn, status, *phrases, id=id))
            return fn

        return register


def assert_verdict(check: Callable, fn: Callable, status: str, phrases: tuple[str, ...]) -> None:
    """Run ``check(fn)`` quietly and assert its status, its message's words and its form."""
    result = check(fn, verbose=False)
    assert result.status == status, result.message
    for phrase in phrases:
        assert phrase in result.message, (phrase, result.message)
    assert "\n" not in result.message, result.message
    opening = {
        "passed": f"Correct: {result.name} passed every test case.",
        "failed": "Not yet: ",
        "not implemented": f"{result.name}: not implemented yet.",
        "error": f"{result.name}: your function raised ",
    }[status]
    assert result.message.startswith(opening), result.message
    assert bool(result) == (status == "passed")


def stub(*args, **kwargs):
    """The student edition's function body: not written yet."""
    raise NotImplementedError("write your answer here")
