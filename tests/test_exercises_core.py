"""The machinery shared by every exercise check: the verdict, the guards and the docstrings."""

import inspect
import re
from pathlib import Path

import pytest
import torch

from transformer_lib import chapters, exercises
from transformer_lib.exercises._core import (
    ExerciseFailure,
    call_student,
    check,
    require_dtype,
    require_finite,
    require_int,
    require_pair,
    require_shape,
    require_tensor,
)

NOTEBOOKS = sorted(Path(__file__).resolve().parent.parent.glob("chapters/[0-9][0-9]_*.ipynb"))
CHAPTERS = [getattr(exercises, name) for name in exercises.__all__ if inspect.ismodule(getattr(exercises, name))]
CHECKS = [
    (module, name, getattr(module, name)) for module in CHAPTERS for name in module.__all__ if name.startswith("check_")
]


def _short(module) -> str:
    return module.__name__.rsplit(".", 1)[1]


def test_every_chapter_module_is_found():
    assert len(NOTEBOOKS) >= 10  # one exercise module per chapter notebook
    for nb in NOTEBOOKS:
        assert exercises.module_for(nb.name) is not None, (
            f"chapters/{nb.name} has no exercise module: write transformer_lib/exercises/{nb.stem[3:]}.py"
        )
    written = {exercises.module_for(nb.name) for nb in NOTEBOOKS}
    assert len(written) == len(NOTEBOOKS), "two notebooks share an exercise module"
    ahead = [_short(m) for m in CHAPTERS if _short(m) not in written]
    assert len(ahead) <= 1, f"exercise modules without a notebook: {ahead}; only the chapter being written may be"
    assert all(name in {c.slug for c in chapters.CHAPTERS} for name in map(_short, CHAPTERS)), (
        "an exercise module is named by its chapter's slug, as transformer_lib/chapters.py lists it"
    )


def test_a_notebook_finds_its_module_by_the_chapters_name_whatever_its_number():
    assert exercises.module_for("04_masking.ipynb") == "masking"
    assert exercises.module_for("chapters/20_experts.ipynb") == "experts"
    assert exercises.module_for("05_masking.ipynb") == "masking"  # a chapter inserted before it
    assert exercises.module_for("99_not_written.ipynb") is None
    with pytest.raises(ValueError, match="NN_name.ipynb"):
        exercises.module_for("experts.ipynb")
    # the old names by number are the same modules
    assert exercises.ch04 is exercises.masking
    from transformer_lib.exercises.ch14 import check_rms_norm

    assert check_rms_norm is exercises.todays_block.check_rms_norm


@pytest.mark.parametrize(("module", "name", "fn"), CHECKS, ids=[f"{m.__name__}.{n}" for m, n, _ in CHECKS])
def test_check_docstring_names_its_chapter_exercise_and_shapes(module, name, fn):
    title = chapters.title(_short(module))
    doc = inspect.getdoc(fn)
    assert re.match(rf'Chapter "{re.escape(title)}", exercise \d+: ', doc), doc
    assert "fn" in doc and "given" in doc, "the docstring says what the student's function is given"


@pytest.mark.parametrize(("module", "name", "fn"), CHECKS, ids=[f"{m.__name__}.{n}" for m, n, _ in CHECKS])
def test_a_check_given_no_function_says_so(module, name, fn, capsys):
    result = fn(torch.zeros(3))  # the student called their function and passed its result
    assert result.status == "failed" and not result
    assert "needs your function itself, but it was given a Tensor" in result.message
    assert capsys.readouterr().out == result.message + "\n"


@check("demo")
def _demo(fn):
    raise ExerciseFailure(f"for the demo, {fn()}")


def test_verdicts_for_each_outcome():
    assert _demo(lambda: "wrong", verbose=False).message == "Not yet: for the demo, wrong"
    stub = _demo(lambda: (_ for _ in ()).throw(NotImplementedError), verbose=False)
    assert (stub.status, stub.message) == ("not implemented", "demo: not implemented yet.")
    crash = _demo(lambda: 1 / 0, verbose=False)
    assert crash.status == "error" and crash.message.startswith("demo: your function raised ZeroDivisionError")


def test_an_error_verdict_stays_on_one_line():
    def crash():
        raise RuntimeError("first line\nsecond line")

    assert _demo(crash, verbose=False).message == "demo: your function raised RuntimeError: first line"


def _fails(guard, *args, **kwargs) -> str:
    with pytest.raises(ExerciseFailure) as info:
        guard(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize("value", [3, 0, torch.tensor(7), torch.tensor([5], dtype=torch.int32)])
def test_require_int_accepts_whole_numbers(value):
    assert require_int(value, "f()") == int(value) and type(require_int(value, "f()")) is int


@pytest.mark.parametrize(
    ("value", "kind"), [(2.0, "a float"), (True, "a bool"), ("3", "a str"), (torch.tensor(2.0), "a Tensor")]
)
def test_require_int_rejects_other_values(value, kind):
    message = _fails(require_int, value, "f(1)", " (hint)")
    assert message.startswith(f"f(1) returned {value!r}, {kind}; return a whole number as an int (hint)")


@pytest.mark.parametrize("shape", [(2,), (2, 3), (1, 2, 3)])
def test_shape_and_dtype_guards_pass_exactly_the_right_tensor(shape, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    assert require_tensor(x, "for x", shape, torch.float64) is x
    require_dtype(x, "floating", "for x")
    wrong_shape = (*shape[:-1], shape[-1] + 1)
    message = _fails(require_shape, x, wrong_shape, "for x", what="the weights", layout="(T, d)", hint=": a hint")
    assert message == f"for x, the weights have shape {shape}; expected (T, d) = {wrong_shape}: a hint."
    assert _fails(require_dtype, x, torch.float32, "for x") == (
        "for x, the result has dtype torch.float64; expected torch.float32."
    )
    assert "expected an integer dtype" in _fails(require_dtype, x, "integer", "for x")
    assert "expected a floating-point dtype" in _fails(require_dtype, x.long(), "floating", "for x")
    assert _fails(require_tensor, x.tolist(), "for x") == "for x, your function returned a list; return a torch.Tensor."


def test_require_pair_and_require_finite():
    a, b = torch.zeros(2), torch.ones(2)
    assert require_pair([a, b], "here", ("x", "y")) == (a, b)
    assert "returned a Tensor; return a pair (x, y)" in _fails(require_pair, a, "here", ("x", "y"))
    assert "here, y is an int; return a pair (x, y)" in _fails(require_pair, (a, 1), "here", ("x", "y"))
    require_finite(a, "here")
    assert "contains NaN or inf" in _fails(require_finite, torch.tensor([0.0, float("nan")]), "here")


def test_call_student_works_on_copies_and_reports_crashes_only_with_a_hint():
    x = torch.arange(4.0)

    def in_place(t):
        t += 1
        return t

    assert torch.equal(call_student(in_place, (x,), "for x"), torch.arange(1.0, 5.0))
    assert torch.equal(x, torch.arange(4.0)), "the caller's tensor is never touched"
    message = _fails(call_student, in_place, (x,), "for x", inputs="x", in_place_hint="do not")
    assert message == "for x, your function changed x in place; do not."

    def crash(t):
        raise RuntimeError("line one\nline two")

    with pytest.raises(RuntimeError):
        call_student(crash, (x,), "for x")  # no hint: the check reports an error
    assert _fails(call_student, crash, (x,), "for x", crash_hint="Look.") == (
        "for x, your function raised RuntimeError: line one. Look."
    )
    assert _fails(call_student, crash, (x,), "for x", crash_hint=lambda exc: "") == (
        "for x, your function raised RuntimeError: line one."
    )
    with pytest.raises(NotImplementedError):
        call_student(lambda t: (_ for _ in ()).throw(NotImplementedError), (x,), "for x", crash_hint="Look.")
